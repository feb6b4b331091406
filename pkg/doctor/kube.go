package doctor

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/reaper-k8s/reaper/pkg/kube"
)

// Permission is one kind of request Reaper's functions make of the
// apiserver (pkg/kube), cluster-wide: Pods end in any namespace.
type Permission struct {
	Verb, Resource, Subresource string
	// Name limits the permission to one object.
	Name string
}

func (p Permission) String() string {
	s := p.Verb + " " + p.Resource
	if p.Subresource != "" {
		s += "/" + p.Subresource
	}
	if p.Name != "" {
		s += " " + p.Name
	}
	return s
}

// Permissions are what Reaper's identity must be allowed, and all that
// deploy/rbac.yaml grants it.
var Permissions = []Permission{
	// Read a Pod before writing its status: its UID and resourceVersion
	// guard the write.
	{Verb: "get", Resource: "pods"},
	// Read a batch's Pods a namespace at a time.
	{Verb: "list", Resource: "pods"},
	// The terminal status itself.
	{Verb: "patch", Resource: "pods", Subresource: "status"},
	// An Event on the Pod for every action.
	{Verb: "create", Resource: "events"},
	// The cluster's identity, which the instances' cluster-uid tag must
	// equal for the sweep to terminate an orphan.
	{Verb: "get", Resource: "namespaces", Name: kube.IdentityNamespace},
}

// The names of the in-cluster objects (deploy/, charts/reaper).
const (
	PolicyName     = "reaper-pod-status"
	FlowSchemaName = "reaper"
)

// The variables of the admission policy that say which Pods are the
// provider's.
const (
	varNodePrefix = "providerNodePrefix"
	varLabelKey   = "providerLabelKey"
	varLabelValue = "providerLabelValue"
)

const (
	rbacFix       = "apply the RBAC: kubectl apply -f deploy/rbac.yaml, or helm upgrade --install reaper charts/reaper (with the identity values the deployment uses)"
	admissionFix  = "apply the admission policy: kubectl apply -f deploy/admission.yaml, or helm upgrade --install reaper charts/reaper"
	flowSchemaFix = "apply the FlowSchema: kubectl apply -f deploy/flowcontrol.yaml, or helm upgrade --install reaper charts/reaper"
	kubeRightsFix = "run the doctor with a kubeconfig of a cluster administrator (KUBECONFIG)"
)

// subject is one identity Reaper may run as, as the apiserver sees it.
type subject struct {
	name   string
	user   string
	groups []string
}

func (id Identity) subjects() []subject {
	return []subject{
		{name: "group " + id.Group, groups: []string{id.Group, "system:authenticated"}},
		{
			name:   "ServiceAccount " + id.ServiceAccountNamespace + "/" + id.ServiceAccount,
			user:   "system:serviceaccount:" + id.ServiceAccountNamespace + ":" + id.ServiceAccount,
			groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + id.ServiceAccountNamespace, "system:authenticated"},
		},
	}
}

// kubeUnreachable fails check when there is no client; it reports whether
// it did.
func (r *run) kubeUnreachable(check string) bool {
	if r.kube != nil {
		return false
	}
	r.add(check, Fail, "cannot reach the cluster: "+r.kubeErr.Error(), "set KUBECONFIG to a kubeconfig of the cluster (kubectl config current-context names the one used)")
	return true
}

// checkPermissions asks the apiserver, with a SubjectAccessReview per
// permission, whether each of Reaper's identities may do what Reaper does.
func (r *run) checkPermissions(ctx context.Context) {
	for _, s := range r.opts.Identity.subjects() {
		check := "permissions of " + s.name
		if r.kubeUnreachable(check) {
			continue
		}
		var denied, allowed []string
		var askErr error
		for _, p := range Permissions {
			review, err := r.kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{
					User: s.user, Groups: s.groups,
					ResourceAttributes: &authorizationv1.ResourceAttributes{
						Verb: p.Verb, Version: "v1", Resource: p.Resource, Subresource: p.Subresource, Name: p.Name,
					},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				askErr = err
				break
			}
			if review.Status.Allowed {
				allowed = append(allowed, p.String())
			} else {
				denied = append(denied, p.String())
			}
		}
		switch {
		case askErr != nil:
			r.add(check, Fail, "cannot ask the apiserver (SubjectAccessReview): "+askErr.Error(), kubeRightsFix)
		case len(denied) > 0:
			r.add(check, Fail, "may not "+strings.Join(denied, ", "), rbacFix)
		default:
			r.add(check, Pass, "may "+strings.Join(allowed, ", "), "")
		}
	}
}

// celString reads a CEL string literal without escapes ('text' or
// "text"), as the chart writes the policy's settings.
var celString = regexp.MustCompile(`^\s*(?:'([^'\\]*)'|"([^"\\]*)")\s*$`)

// policySettings are the admission policy's variables that say which Pods
// are the provider's: on a Node whose name starts with nodePrefix, or
// carrying the label labelKey=labelValue. An empty string turns one off.
type policySettings struct {
	nodePrefix, labelKey, labelValue string
}

// checkAdmission checks that the admission policy lets Reaper write the
// provider's Pods and only them: the policy is in the cluster and bound to
// deny; its settings can be read; its node prefix matches the provider's
// Nodes, or failing that its label is on the Pods there.
func (r *run) checkAdmission(ctx context.Context) {
	check := "admission policy " + PolicyName
	if r.kubeUnreachable(check) {
		return
	}
	policy, ok := r.readBoundPolicy(ctx, check)
	if !ok {
		return
	}
	settings, ok := r.readPolicySettings(check, policy)
	if !ok {
		return
	}
	prefix := settings.nodePrefix
	nodes, ok := r.readProviderNodes(ctx, check, prefix)
	if !ok {
		return
	}
	matched, unmatched := splitByPrefix(nodes, prefix)
	switch {
	case len(matched) > 0 && len(unmatched) == 0:
		r.add(check, Pass, fmt.Sprintf("node prefix %q matches the provider's Nodes %s", prefix, strings.Join(matched, ", ")), "")
	case len(matched) > 0:
		r.add(check, Warn, fmt.Sprintf("node prefix %q matches %s but not %s: Reaper may not write the Pods on those", prefix, strings.Join(matched, ", "), strings.Join(unmatched, ", ")),
			nodePrefixFix(unmatched)+"; or narrow -provider-nodes if those Nodes are another provider's")
	case settings.labelKey != "":
		r.checkProviderLabel(ctx, check, settings, nodes)
	default:
		r.add(check, Fail, nodePrefixMismatch(prefix, nodes)+": every status write Reaper makes is refused", nodePrefixFix(nodes))
	}
}

// readBoundPolicy reads the admission policy and its binding. When either
// is missing, or the binding does not deny, it fails check and answers
// false.
func (r *run) readBoundPolicy(ctx context.Context, check string) (*admissionregistrationv1.ValidatingAdmissionPolicy, bool) {
	adm := r.kube.AdmissionregistrationV1()
	policy, err := adm.ValidatingAdmissionPolicies().Get(ctx, PolicyName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		r.add(check, Fail, "not in the cluster: nothing keeps Reaper's writes to the provider's Pods", admissionFix)
		return nil, false
	}
	if err != nil {
		r.add(check, Fail, "cannot read it: "+err.Error(), kubeRightsFix)
		return nil, false
	}
	binding, err := adm.ValidatingAdmissionPolicyBindings().Get(ctx, PolicyName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		r.add(check, Fail, "the policy has no binding "+PolicyName+", so it refuses nothing", admissionFix)
		return nil, false
	case err != nil:
		r.add(check, Fail, "cannot read its binding: "+err.Error(), kubeRightsFix)
		return nil, false
	case binding.Spec.PolicyName != PolicyName || !slices.Contains(binding.Spec.ValidationActions, admissionregistrationv1.Deny):
		r.add(check, Fail, fmt.Sprintf("its binding names policy %q with actions %v, so it refuses nothing", binding.Spec.PolicyName, binding.Spec.ValidationActions), admissionFix)
		return nil, false
	}
	return policy, true
}

// readPolicySettings reads the policy's provider settings. A setting that
// is not a plain string literal leaves the doctor unable to tell which
// Pods the policy covers: it warns and answers false.
func (r *run) readPolicySettings(check string, policy *admissionregistrationv1.ValidatingAdmissionPolicy) (policySettings, bool) {
	var s policySettings
	fields := map[string]*string{varNodePrefix: &s.nodePrefix, varLabelKey: &s.labelKey, varLabelValue: &s.labelValue}
	for _, v := range policy.Spec.Variables {
		field, ok := fields[v.Name]
		if !ok {
			continue
		}
		m := celString.FindStringSubmatch(v.Expression)
		if m == nil {
			r.add(check, Warn, fmt.Sprintf("variable %s is %s, not a plain string: the doctor cannot tell which Pods it covers", v.Name, v.Expression),
				"check by hand that it matches the provider's node names or Pod labels")
			return policySettings{}, false
		}
		*field = m[1] + m[2]
	}
	return s, true
}

// readProviderNodes lists the names of the Nodes Options.ProviderNodes
// selects. With none the policy cannot be judged against them: the
// provider has not started yet (deploy.md runs the doctor before it is
// pointed at the stack, and again once it runs), or its Nodes carry other
// labels. Nothing is known to be wrong, so it warns, saying which selector
// matched nothing and what to do, and answers false.
func (r *run) readProviderNodes(ctx context.Context, check, prefix string) ([]string, bool) {
	sel := r.opts.ProviderNodes
	nodes, err := r.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		r.add(check, Fail, "cannot list the Nodes "+sel+": "+err.Error(), kubeRightsFix)
		return nil, false
	}
	if len(nodes.Items) == 0 {
		r.add(check, Warn, fmt.Sprintf("no provider Node yet: no Node matches -provider-nodes %q, so the doctor cannot tell whether node prefix %q matches the provider's Nodes", sel, prefix),
			"start the provider (docs/provider.md) and run the doctor again; if it runs already, find the labels of its Nodes (kubectl get nodes --show-labels) and pass a selector of them with -provider-nodes")
		return nil, false
	}
	names := make([]string, 0, len(nodes.Items))
	for _, n := range nodes.Items {
		names = append(names, n.Name)
	}
	return names, true
}

// splitByPrefix parts node names into those that start with prefix and
// the rest; an empty prefix matches none, as in the policy.
func splitByPrefix(names []string, prefix string) (matched, unmatched []string) {
	for _, name := range names {
		if prefix != "" && strings.HasPrefix(name, prefix) {
			matched = append(matched, name)
		} else {
			unmatched = append(unmatched, name)
		}
	}
	return matched, unmatched
}

// checkProviderLabel is the policy's other way to know the provider's
// Pods, for when its node prefix matches none of the provider's Nodes: it
// passes when a Pod on those Nodes carries the policy's label.
func (r *run) checkProviderLabel(ctx context.Context, check string, settings policySettings, nodes []string) {
	sel := labels.Set{settings.labelKey: settings.labelValue}.AsSelector().String()
	// One page is enough: any Pod on the provider's Nodes with the label
	// shows the provider puts it there.
	pods, err := r.kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: sel, Limit: 500})
	if err != nil {
		r.add(check, Fail, "cannot list the Pods labelled "+sel+": "+err.Error(), kubeRightsFix)
		return
	}
	for _, p := range pods.Items {
		if slices.Contains(nodes, p.Spec.NodeName) {
			r.add(check, Pass, fmt.Sprintf("label %s is on the provider's Pods (%s/%s on %s)", sel, p.Namespace, p.Name, p.Spec.NodeName), "")
			return
		}
	}
	r.add(check, Fail, nodePrefixMismatch(settings.nodePrefix, nodes)+", and no Pod on them is labelled "+sel+": every status write Reaper makes is refused",
		nodePrefixFix(nodes)+"; or have the provider label its Pods "+sel)
}

// nodePrefixMismatch says that prefix matches none of the provider's
// Nodes, or is off.
func nodePrefixMismatch(prefix string, nodes []string) string {
	if prefix == "" {
		return fmt.Sprintf("the node prefix is off (the provider's Nodes: %s)", strings.Join(nodes, ", "))
	}
	return fmt.Sprintf("node prefix %q matches none of the provider's Nodes (%s)", prefix, strings.Join(nodes, ", "))
}

// nodePrefixFix says how to set the policy's node prefix so that it
// matches the unmatched Nodes. The prefix is a value of the chart: the
// manifests of deploy/ are its rendering and are not edited.
func nodePrefixFix(unmatched []string) string {
	return fmt.Sprintf("set the chart value admission.providerNodePrefix to the start of the provider's node names (%s): "+
		"helm upgrade --install reaper charts/reaper --reuse-values --set admission.providerNodePrefix=<prefix>; "+
		"without Helm in the cluster, render the manifests with it and the other values the deployment uses, and apply them: "+
		"helm template reaper charts/reaper --set admission.providerNodePrefix=<prefix> | kubectl apply -f -", strings.Join(unmatched, ", "))
}

func (r *run) checkFlowSchema(ctx context.Context) {
	check := "FlowSchema " + FlowSchemaName
	if r.kubeUnreachable(check) {
		return
	}
	fc := r.kube.FlowcontrolV1()
	fs, err := fc.FlowSchemas().Get(ctx, FlowSchemaName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		r.add(check, Fail, "not in the cluster: in a burst Reaper's requests compete in global-default with every other client", flowSchemaFix)
		return
	case err != nil:
		r.add(check, Fail, "cannot read it: "+err.Error(), kubeRightsFix)
		return
	}
	level := fs.Spec.PriorityLevelConfiguration.Name
	if _, err := fc.PriorityLevelConfigurations().Get(ctx, level, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		r.add(check, Fail, "its priority level "+level+" is not in the cluster, so the apiserver ignores it", flowSchemaFix)
		return
	} else if err != nil {
		r.add(check, Fail, "cannot read its priority level "+level+": "+err.Error(), kubeRightsFix)
		return
	}
	id := r.opts.Identity
	var group, serviceAccount bool
	for _, rule := range fs.Spec.Rules {
		for _, s := range rule.Subjects {
			switch {
			case s.Kind == flowcontrolv1.SubjectKindGroup && s.Group != nil && s.Group.Name == id.Group:
				group = true
			case s.Kind == flowcontrolv1.SubjectKindServiceAccount && s.ServiceAccount != nil && s.ServiceAccount.Namespace == id.ServiceAccountNamespace &&
				(s.ServiceAccount.Name == "*" || s.ServiceAccount.Name == id.ServiceAccount):
				serviceAccount = true
			}
		}
	}
	if !group || !serviceAccount {
		r.add(check, Fail, fmt.Sprintf("its subjects leave out Reaper's group %s or ServiceAccount %s/%s", id.Group, id.ServiceAccountNamespace, id.ServiceAccount), flowSchemaFix)
		return
	}
	r.add(check, Pass, "priority level "+level+" for the group "+id.Group+" and the ServiceAccounts of "+id.ServiceAccountNamespace, "")
}

package deploy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// Objects are the chart's objects rendered for namespace with values
// (Template), decoded.
func Objects(ctx context.Context, namespace string, values map[string]any) ([]runtime.Object, error) {
	manifest, err := Template(ctx, namespace, values)
	if err != nil {
		return nil, err
	}
	return Decode(manifest)
}

// Decode decodes the objects of a manifest of the kinds the chart renders,
// such as one of this directory's files.
func Decode(manifest string) ([]runtime.Object, error) {
	var objs []runtime.Object
	docs := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifest)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, err
		}
		if string(js) == "null" {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, err
		}
		objs = append(objs, obj)
	}
}

// Create creates one object of the kinds the chart renders.
func Create(ctx context.Context, client kubernetes.Interface, obj runtime.Object) error {
	opts := metav1.CreateOptions{}
	var err error
	switch obj := obj.(type) {
	case *corev1.Namespace:
		_, err = client.CoreV1().Namespaces().Create(ctx, obj, opts)
	case *corev1.ServiceAccount:
		_, err = client.CoreV1().ServiceAccounts(obj.Namespace).Create(ctx, obj, opts)
	case *rbacv1.ClusterRole:
		_, err = client.RbacV1().ClusterRoles().Create(ctx, obj, opts)
	case *rbacv1.ClusterRoleBinding:
		_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, obj, opts)
	case *admissionregistrationv1.ValidatingAdmissionPolicy:
		_, err = client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, obj, opts)
	case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
		_, err = client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, obj, opts)
	case *flowcontrolv1.FlowSchema:
		_, err = client.FlowcontrolV1().FlowSchemas().Create(ctx, obj, opts)
	case *flowcontrolv1.PriorityLevelConfiguration:
		_, err = client.FlowcontrolV1().PriorityLevelConfigurations().Create(ctx, obj, opts)
	default:
		return fmt.Errorf("the chart renders no %T", obj)
	}
	if err != nil {
		return fmt.Errorf("create %T: %w", obj, err)
	}
	return nil
}

// Package userdata renders what a provider puts on the EC2 instance it
// launches for one Pod: the user-data that installs the workload supervisor
// (reaper-wrapper, a POSIX shell script run by the systemd unit
// reaper-workload.service), its configuration, and the CloudWatch agent
// configuration that ships the supervisor's exit lines (exit line v1) to the
// log group Reaper subscribes to. It also gives the instance tags and the
// launch settings Reaper relies on.
//
// A provider calls Launch (or Render, Tags and LaunchSettings separately)
// instead of writing its own script. The pieces (Wrapper, WrapperConfig,
// EnvFile, Unit, AgentConfig) are exported for providers that assemble their
// own user-data, e.g. as a cloud-init multipart.
package userdata

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"text/template"
	"time"
	"unicode"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// Restart policies, as in the Pod spec.
const (
	RestartAlways    = "Always"
	RestartOnFailure = "OnFailure"
	RestartNever     = "Never"
)

// When the wrapper powers the host off after the final exit line
// (Options.ShutdownMode).
const (
	// ShutdownWhenShipped powers off as soon as the CloudWatch agent's saved
	// read offset covers the line, at the latest after ShutdownDelay. The
	// agent saves it once PutLogEvents has accepted the line, or once it has
	// given up on it for good (then the line is lost, as it would be with
	// ShutdownAfterDelay). It is the default.
	ShutdownWhenShipped = "when-shipped"
	// ShutdownAfterDelay powers off after ShutdownDelay, leaving the host to
	// Reaper's termination until then.
	ShutdownAfterDelay = "after-delay"
	// ShutdownWhenPodWritten powers off as soon as Reaper has written the
	// Pod's terminal status, which it tells by tagging the instance
	// (TagKeys.PodWritten, REAPER_TAG_POD_WRITTEN) once per batch; the
	// host reads its tags through the instance metadata once a second, at
	// no API cost, at the latest until ShutdownDelay. It is the mode for a
	// provider that derives the Pod's status from the instance's state:
	// the instance never ends before the Pod tells the truth. It needs the
	// instance's tags in its metadata (LaunchSettings.MetadataTags), so
	// every tag key must be one the metadata can show
	// (model.ValidMetadataTagKey: no "/", unlike the default keys), and
	// Reaper deployed with REAPER_TAG_POD_WRITTEN and a power-off grace.
	ShutdownWhenPodWritten = "when-pod-written"
)

// Defaults for Options.
const (
	DefaultExitLogPath   = "/var/log/reaper/exit.log"
	DefaultContainerCLI  = "docker"
	DefaultShutdownDelay = 10 * time.Minute
)

// Where the user-data installs things on the instance.
const (
	WrapperPath     = "/usr/local/bin/reaper-wrapper"
	ConfigPath      = "/etc/reaper/workload.conf"
	EnvFilePath     = "/etc/reaper/workload.env"
	UnitName        = "reaper-workload.service"
	UnitPath        = "/etc/systemd/system/" + UnitName
	AgentConfigPath = "/opt/aws/amazon-cloudwatch-agent/etc/reaper-exits.json"
	StateDir        = "/var/lib/reaper"
)

// MaxUserDataBytes is EC2's limit on user-data before base64 encoding.
const MaxUserDataBytes = 16384

// ShutdownBehaviorTerminate is the InstanceInitiatedShutdownBehavior the
// provider must launch with: the wrapper's last-resort power-off then
// terminates the instance instead of leaving it stopped.
const ShutdownBehaviorTerminate = "terminate"

// MetadataHopLimit is the HttpPutResponseHopLimit the provider must launch
// with. The IMDSv2 token response then dies one hop away from the host: the
// wrapper on the host gets a token, a container behind a bridge network
// (one more hop) does not, so it cannot read the instance role's
// credentials.
const MetadataHopLimit int32 = 1

// EnvVar is one environment variable of the container, in Pod spec order.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Pod is what the user-data needs of a Pod and its (single) container. The
// JSON names follow the Kubernetes API.
type Pod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	// Container is the container's name in the Pod spec.
	Container string `json:"container"`
	Image     string `json:"image"`
	// Command replaces the image's entrypoint and Args its command, as in
	// Kubernetes. Command[0] becomes --entrypoint.
	Command []string `json:"command,omitempty"`
	Args    []string `json:"args,omitempty"`
	Env     []EnvVar `json:"env,omitempty"`
	// RestartPolicy is Always, OnFailure or Never; empty means Always, as
	// Kubernetes defaults it.
	RestartPolicy string `json:"restartPolicy,omitempty"`
}

// Options tune the rendering. Cluster is required by Render and Launch; the
// zero value of every other field gives its default.
type Options struct {
	// Cluster is the name of the cluster the Pod belongs to, the value of
	// the cluster tag. It must equal REAPER_CLUSTER of the Reaper deployment
	// that serves the cluster: an instance without it is never Reaper's.
	Cluster string
	// ClusterUID is the identity of the cluster: the UID of its kube-system
	// namespace (metadata.uid), which a cluster recreated under the same
	// name does not share. When set it must look like a UID, and it goes on
	// the instance as the cluster identity tag (TagKeys.ClusterUID). It is
	// optional, but Reaper treats an instance as an orphan (no live Pod:
	// deleted, or lost while its instance ran on) only when this tag equals
	// the identity of the apiserver Reaper reaches. An instance without it
	// still has its exit lines believed and its Pod written, but Reaper's
	// sweep never terminates it as an orphan: it runs until its workload
	// ends or the provider terminates it.
	ClusterUID string
	// LogGroup receives the exit lines (default DefaultLogGroup of the
	// cluster, "/reaper/<cluster>/exits"). It must be the group the Reaper
	// construct subscribes to.
	LogGroup string
	// ExitLogPath is the file the wrapper appends exit lines to and the
	// agent ships (default /var/log/reaper/exit.log).
	ExitLogPath string
	// ContainerCLI is the docker-compatible CLI that runs the workload
	// (default docker; nerdctl and podman take the same commands). Only with
	// docker does the user-data turn on live-restore.
	ContainerCLI string
	// MaxRestarts caps in-place restarts (0: unlimited). When the cap is
	// reached the Pod ends with that exit.
	MaxRestarts int
	// ShutdownMode is when the wrapper powers the host off after the final
	// exit line: ShutdownWhenShipped (default), ShutdownWhenPodWritten or
	// ShutdownAfterDelay.
	ShutdownMode string
	// ShutdownDelay is how long after the final exit line the wrapper waits
	// at most before powering the host off itself, unless Reaper terminates
	// the instance first (default 10m; rounded up to whole seconds).
	ShutdownDelay time.Duration
	// DockerRunArgs are extra flags for "docker run", e.g. "--gpus", "all".
	// Host networking (--network=host, --net host, a podman ns: path) is
	// refused unless AllowHostNetwork is set.
	DockerRunArgs []string
	// AllowHostNetwork lets DockerRunArgs put the container in the host's
	// network namespace. The workload then reaches the instance metadata
	// service as the host does (the hop limit of 1 stops only a container
	// behind a bridge) and gets the instance role's credentials: everything
	// the role may do, the workload may do. Set it only for a trusted image
	// on an instance role that allows no more than the CloudWatch agent
	// needs.
	AllowHostNetwork bool
	// TagKeys overrides the instance tag keys; empty fields keep defaults.
	TagKeys model.TagKeys
	// ExitToken is the launch's exit token, a secret of 32 to 128 letters,
	// digits, - and _ (model.ValidExitToken): the wrapper's configuration,
	// readable by root only, carries it into every exit line, and the tags
	// only its hash (TagKeys.ExitToken). Launch draws a new one
	// (NewExitToken) when it is empty; Render, WrapperConfig and Tags take
	// it as it is: give them the same one for one launch, and a new one for
	// every launch. Empty there, the instance gets no exit-token tag.
	ExitToken string
}

// NewExitToken draws a launch's exit token: 256 random bits, in hex.
func NewExitToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails: crypto/rand crashes the program instead
	return hex.EncodeToString(b)
}

// Tags returns the tags the provider writes on the instance at launch, for
// the Pod of the cluster opts.Cluster: keys from opts.TagKeys (empty fields
// take the defaults), the cluster identity tag when opts.ClusterUID is set,
// and the exit token's hash when opts.ExitToken is. Launch checks pod and
// opts; Tags takes them as they are.
func Tags(pod Pod, opts Options) map[string]string {
	keys := opts.TagKeys.WithDefaults()
	tags := map[string]string{
		keys.Managed:      "true",
		keys.PodNamespace: pod.Namespace,
		keys.PodName:      pod.Name,
		keys.PodUID:       pod.UID,
		keys.Cluster:      opts.Cluster,
	}
	if opts.ClusterUID != "" {
		tags[keys.ClusterUID] = opts.ClusterUID
	}
	if opts.ExitToken != "" {
		tags[keys.ExitToken] = model.ExitTokenHash(opts.ExitToken)
	}
	return tags
}

// LaunchSettings is everything a provider sets on RunInstances for the Pod.
type LaunchSettings struct {
	// UserData is the rendered script, and UserDataBase64 the value for
	// RunInstances' UserData (gzip-compressed first when the script is over
	// 16 KiB; cloud-init unpacks it).
	UserData       string `json:"userData"`
	UserDataBase64 string `json:"userDataBase64"`
	// Tags go on the instance (TagSpecifications, resource type instance),
	// the exit token's hash among them; the token itself is in the
	// user-data only.
	Tags map[string]string `json:"tags"`
	// InstanceInitiatedShutdownBehavior is always "terminate".
	InstanceInitiatedShutdownBehavior string `json:"instanceInitiatedShutdownBehavior"`
	// MetadataHTTPTokens is "required": the wrapper speaks IMDSv2 only.
	MetadataHTTPTokens string `json:"metadataHttpTokens"`
	// MetadataHTTPPutResponseHopLimit is MetadataHopLimit (1), for
	// MetadataOptions.HttpPutResponseHopLimit.
	MetadataHTTPPutResponseHopLimit int32 `json:"metadataHttpPutResponseHopLimit"`
	// MetadataTags is "enabled" with ShutdownWhenPodWritten, for
	// MetadataOptions.InstanceMetadataTags: the host reads Reaper's
	// Pod-written tag there. Otherwise "disabled".
	MetadataTags string `json:"metadataTags"`
}

// Launch validates pod and opts and returns the launch settings, with a
// new exit token (NewExitToken) unless opts.ExitToken is set.
func Launch(pod Pod, opts Options) (LaunchSettings, error) {
	if opts.ExitToken == "" {
		opts.ExitToken = NewExitToken()
	}
	script, err := Render(pod, opts)
	if err != nil {
		return LaunchSettings{}, err
	}
	enc, err := EncodeUserData(script)
	if err != nil {
		return LaunchSettings{}, err
	}
	metadataTags := "disabled"
	if opts.ShutdownMode == ShutdownWhenPodWritten {
		metadataTags = "enabled"
	}
	return LaunchSettings{
		UserData:                          script,
		UserDataBase64:                    enc,
		Tags:                              Tags(pod, opts),
		InstanceInitiatedShutdownBehavior: ShutdownBehaviorTerminate,
		MetadataHTTPTokens:                "required",
		MetadataHTTPPutResponseHopLimit:   MetadataHopLimit,
		MetadataTags:                      metadataTags,
	}, nil
}

// EncodeUserData base64-encodes script for RunInstances, gzip-compressing it
// first when it exceeds MaxUserDataBytes. It fails when even that is too big.
func EncodeUserData(script string) (string, error) {
	data := []byte(script)
	if len(data) > MaxUserDataBytes {
		var b bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
		_, _ = zw.Write(data)
		if err := zw.Close(); err != nil {
			return "", err
		}
		if b.Len() > MaxUserDataBytes {
			return "", fmt.Errorf("userdata: user-data is %d bytes gzip-compressed, over EC2's %d", b.Len(), MaxUserDataBytes)
		}
		data = b.Bytes()
	}
	return base64.StdEncoding.EncodeToString(data), nil
}

//go:embed templates/wrapper.sh
var wrapperScript string

//go:embed templates/userdata.sh.tmpl
var userdataTemplate string

//go:embed templates/unit.service.tmpl
var unitTemplate string

var (
	tmplUserdata = template.Must(template.New("userdata").Parse(userdataTemplate))
	tmplUnit     = template.Must(template.New("unit").Parse(unitTemplate))
)

// Wrapper returns the supervisor script installed at WrapperPath. It is the
// same for every Pod; WrapperConfig carries the Pod. It is
// templates/wrapper.sh without its comment lines and indentation (EC2
// limits user-data to 16 KiB); shellcheck directives stay.
func Wrapper() string { return installedWrapper }

var installedWrapper = compact(wrapperScript)

// compact drops the script's comment lines, but for shellcheck
// directives, and the indentation of every line: the script has no
// here-document or quoted string whose leading blanks matter.
func compact(s string) string {
	lines := strings.SplitAfter(s, "\n")
	var b strings.Builder
	b.WriteString(lines[0])
	b.WriteString("# reaper-wrapper, from github.com/reaper-k8s/reaper pkg/userdata/templates/wrapper.sh (comments and indentation removed).\n")
	for _, l := range lines[1:] {
		t := strings.TrimLeft(l, " \t")
		if strings.HasPrefix(t, "#") && !strings.HasPrefix(t, "# shellcheck ") {
			continue
		}
		b.WriteString(t)
	}
	return b.String()
}

var (
	logGroupName = regexp.MustCompile(`^[A-Za-z0-9._/#-]{1,512}$`)
	plainPath    = regexp.MustCompile(`^/[A-Za-z0-9._/-]*[A-Za-z0-9._-]$`)
	cliName      = regexp.MustCompile(`^[A-Za-z0-9._/-]+$`)
	// kubeUID is a UID as the apiserver writes it: lower-case, so that it
	// compares equal to what Reaper reads.
	kubeUID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

// The Pod's names are checked as the apiserver checks them, and as the
// exit line's are (package exitline).
func validLabel(s string) bool { return len(validation.IsDNS1123Label(s)) == 0 }

func validSubdomain(s string) bool { return len(validation.IsDNS1123Subdomain(s)) == 0 }

// text checks a free-form value: UTF-8 without NUL (the shell cannot carry NUL).
func text(what, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s is not valid UTF-8", what)
	}
	if strings.ContainsRune(s, 0) {
		return fmt.Errorf("%s contains a NUL byte", what)
	}
	return nil
}

// Validate reports every problem with the Pod at once.
func (p Pod) Validate() error {
	var errs []error
	if !validLabel(p.Namespace) {
		errs = append(errs, fmt.Errorf("namespace %q is not a DNS label", p.Namespace))
	}
	if !validSubdomain(p.Name) {
		errs = append(errs, fmt.Errorf("name %q is not a DNS subdomain", p.Name))
	}
	if !model.ValidUID(p.UID) {
		errs = append(errs, fmt.Errorf("uid %q is not a UUID", p.UID))
	}
	if !validLabel(p.Container) {
		errs = append(errs, fmt.Errorf("container %q is not a DNS label", p.Container))
	}
	switch {
	case p.Image == "":
		errs = append(errs, errors.New("image is empty"))
	case strings.HasPrefix(p.Image, "-") || strings.IndexFunc(p.Image, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0 || !utf8.ValidString(p.Image):
		errs = append(errs, fmt.Errorf("image %q is not an image reference", p.Image))
	}
	switch p.RestartPolicy {
	case "", RestartAlways, RestartOnFailure, RestartNever:
	default:
		errs = append(errs, fmt.Errorf("restartPolicy %q is not Always, OnFailure or Never", p.RestartPolicy))
	}
	if len(p.Command) > 0 && p.Command[0] == "" {
		errs = append(errs, errors.New("command[0] is empty"))
	}
	for i, s := range p.Command {
		if err := text(fmt.Sprintf("command[%d]", i), s); err != nil {
			errs = append(errs, err)
		}
	}
	for i, s := range p.Args {
		if err := text(fmt.Sprintf("args[%d]", i), s); err != nil {
			errs = append(errs, err)
		}
	}
	// The environment goes to the container through docker's --env-file
	// only, never as -e arguments, which any local user can read in the
	// docker client's command line. That file is line based and skips
	// lines starting with #.
	for i, e := range p.Env {
		switch {
		case e.Name == "" || strings.ContainsRune(e.Name, '=') || strings.IndexFunc(e.Name, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0 || !utf8.ValidString(e.Name):
			errs = append(errs, fmt.Errorf("env[%d] name %q is empty or has '=', spaces or control characters", i, e.Name))
		case strings.HasPrefix(e.Name, "#"):
			errs = append(errs, fmt.Errorf("env[%d] name %q starts with '#', which docker's --env-file reads as a comment", i, e.Name))
		}
		if err := text(fmt.Sprintf("env[%d] (%s) value", i, e.Name), e.Value); err != nil {
			errs = append(errs, err)
		}
		if strings.ContainsAny(e.Value, "\n\r") {
			errs = append(errs, fmt.Errorf("env[%d] (%s) value contains a line break, which docker's --env-file cannot carry", i, e.Name))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("userdata: invalid pod: %w", errors.Join(errs...))
	}
	return nil
}

// resolved is Options with defaults applied and checked.
type resolved struct {
	Options
	delaySeconds int
}

func (o Options) resolve() (resolved, error) {
	o = o.withDefaults()
	errs := slices.Concat(o.pathErrors(), o.shutdownErrors(), o.dockerRunErrors(), o.identityErrors())
	if len(errs) > 0 {
		return resolved{}, fmt.Errorf("userdata: invalid options: %w", errors.Join(errs...))
	}
	secs := int((o.ShutdownDelay + time.Second - 1) / time.Second)
	return resolved{Options: o, delaySeconds: secs}, nil
}

// withDefaults is o with every unset option at its default.
func (o Options) withDefaults() Options {
	if o.LogGroup == "" && o.Cluster != "" {
		o.LogGroup = model.DefaultLogGroup(o.Cluster)
	}
	if o.ExitLogPath == "" {
		o.ExitLogPath = DefaultExitLogPath
	}
	if o.ContainerCLI == "" {
		o.ContainerCLI = DefaultContainerCLI
	}
	if o.ShutdownMode == "" {
		o.ShutdownMode = ShutdownWhenShipped
	}
	if o.ShutdownDelay == 0 {
		o.ShutdownDelay = DefaultShutdownDelay
	}
	return o
}

// pathErrors checks the names the user-data writes into the host's
// configuration: the log group, the exit log, the container CLI.
func (o Options) pathErrors() []error {
	var errs []error
	if o.LogGroup != "" && !logGroupName.MatchString(o.LogGroup) {
		errs = append(errs, fmt.Errorf("log group %q is not a CloudWatch Logs group name (set LogGroup when the cluster name does not fit one)", o.LogGroup))
	}
	if !plainPath.MatchString(o.ExitLogPath) || strings.Contains(o.ExitLogPath, "..") {
		errs = append(errs, fmt.Errorf("exit log path %q must be absolute and use only letters, digits and . _ - /", o.ExitLogPath))
	}
	if !cliName.MatchString(o.ContainerCLI) || strings.HasPrefix(o.ContainerCLI, "-") {
		errs = append(errs, fmt.Errorf("container CLI %q is not a command name or path", o.ContainerCLI))
	}
	if o.MaxRestarts < 0 {
		errs = append(errs, fmt.Errorf("max restarts %d is negative", o.MaxRestarts))
	}
	return errs
}

// shutdownErrors checks the shutdown mode and what it needs.
func (o Options) shutdownErrors() []error {
	var errs []error
	switch o.ShutdownMode {
	case ShutdownWhenShipped, ShutdownAfterDelay:
	case ShutdownWhenPodWritten:
		keys := o.TagKeys.WithDefaults()
		if o.TagKeys.PodWritten == "" {
			errs = append(errs, fmt.Errorf("shutdown mode %s needs TagKeys.PodWritten, the REAPER_TAG_POD_WRITTEN of the Reaper deployment", ShutdownWhenPodWritten))
		}
		for _, k := range []string{keys.Managed, keys.PodNamespace, keys.PodName, keys.PodUID, keys.Cluster, keys.ClusterUID, keys.ExitToken, keys.PodWritten} {
			if k != "" && !model.ValidMetadataTagKey(k) {
				errs = append(errs, fmt.Errorf("shutdown mode %s shows the instance's tags in its metadata, where tag key %q cannot be (letters, digits and + - = . , _ : @ only): set TagKeys, and Reaper's REAPER_TAG_* to match", ShutdownWhenPodWritten, k))
			}
		}
	default:
		errs = append(errs, fmt.Errorf("shutdown mode %q is not %s, %s or %s", o.ShutdownMode, ShutdownWhenShipped, ShutdownWhenPodWritten, ShutdownAfterDelay))
	}
	if o.ShutdownDelay < 0 {
		errs = append(errs, fmt.Errorf("shutdown delay %v is negative", o.ShutdownDelay))
	}
	return errs
}

// dockerRunErrors checks the container's own docker run arguments: text
// only, none the wrapper owns, and not the host's network unless allowed.
func (o Options) dockerRunErrors() []error {
	var errs []error
	for i, a := range o.DockerRunArgs {
		if err := text(fmt.Sprintf("docker run arg %d", i), a); err != nil {
			errs = append(errs, err)
		}
		for _, owned := range []string{"--rm", "--name", "--restart"} {
			if a == owned || strings.HasPrefix(a, owned+"=") {
				errs = append(errs, fmt.Errorf("docker run arg %q: the wrapper owns %s", a, owned))
			}
		}
		if !o.AllowHostNetwork {
			if mode, ok := hostNetwork(o.DockerRunArgs, i); ok {
				errs = append(errs, fmt.Errorf("docker run args put the container in the host's network (%s): "+
					"the workload would get the instance role's credentials from IMDS (the hop limit of 1 stops only a bridged container); "+
					"set AllowHostNetwork if that is meant", mode))
			}
		}
	}
	return errs
}

// identityErrors checks what names the launch: the tag keys, the exit
// token, the cluster's UID.
func (o Options) identityErrors() []error {
	var errs []error
	keys := o.TagKeys.WithDefaults()
	for _, k := range []string{keys.Managed, keys.PodNamespace, keys.PodName, keys.PodUID, keys.Cluster, keys.ClusterUID, keys.ExitToken} {
		if len(k) > 128 || strings.HasPrefix(strings.ToLower(k), "aws:") || !utf8.ValidString(k) {
			errs = append(errs, fmt.Errorf("tag key %q is not a valid EC2 tag key", k))
		}
	}
	if o.ExitToken != "" && !model.ValidExitToken(o.ExitToken) {
		// Never quoted: it is a secret.
		errs = append(errs, errors.New("exit token is not 32 to 128 letters, digits, - or _ (NewExitToken draws one)"))
	}
	if o.ClusterUID != "" && !kubeUID.MatchString(o.ClusterUID) {
		errs = append(errs, fmt.Errorf("cluster UID %q is not a UID as the apiserver writes it (lower-case UUID): set it to the metadata.uid of the cluster's kube-system namespace", o.ClusterUID))
	}
	return errs
}

// hostNetwork reports whether args[i] starts a network flag (--network or
// --net, with its value after = or in the next argument) that puts the
// container in the host's network namespace: "host", or podman's "ns:PATH"
// (a namespace by path, the host's among others). It returns the flag as
// written.
func hostNetwork(args []string, i int) (string, bool) {
	a := args[i]
	for _, f := range []string{"--network", "--net"} {
		var v string
		switch {
		case a == f && i+1 < len(args):
			v, a = args[i+1], a+" "+args[i+1]
		case strings.HasPrefix(a, f+"="):
			v = strings.TrimPrefix(a, f+"=")
		default:
			continue
		}
		return a, v == "host" || strings.HasPrefix(v, "ns:")
	}
	return "", false
}

// maxTagValue is EC2's limit on a tag value, in Unicode characters.
const maxTagValue = 256

// checkCluster checks the cluster name, the value of the cluster tag. That
// value must equal REAPER_CLUSTER exactly, so control characters and spaces
// at either end, invisible in a console and most likely a mistake, are
// refused.
func checkCluster(c string) error {
	switch {
	case c == "":
		return errors.New("cluster is empty: set it to the name of the Pod's cluster, as in REAPER_CLUSTER of the Reaper deployment that serves it")
	case !utf8.ValidString(c):
		return fmt.Errorf("cluster %q is not valid UTF-8", c)
	case utf8.RuneCountInString(c) > maxTagValue:
		return fmt.Errorf("cluster name has %d characters, over EC2's %d for a tag value", utf8.RuneCountInString(c), maxTagValue)
	case strings.HasPrefix(strings.ToLower(c), "aws:"):
		return fmt.Errorf("cluster %q starts with aws:, which AWS reserves", c)
	case strings.IndexFunc(c, unicode.IsControl) >= 0 || strings.TrimSpace(c) != c:
		return fmt.Errorf("cluster %q has control characters or leading or trailing spaces", c)
	}
	return nil
}

func (p Pod) policy() string {
	if p.RestartPolicy == "" {
		return RestartAlways
	}
	return p.RestartPolicy
}

// shq quotes s as one shell word.
func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

var bareWord = regexp.MustCompile(`^[A-Za-z0-9_./:@%+,=-]+$`)

// shword quotes s as one shell word, leaving plain words bare for reading.
func shword(s string) string {
	if bareWord.MatchString(s) && !strings.HasPrefix(s, "=") {
		return s
	}
	return shq(s)
}

// EnvFile returns the --env-file the user-data writes at EnvFilePath: one
// NAME=value line per variable ("" when there is none).
func EnvFile(pod Pod) (string, error) {
	if err := pod.Validate(); err != nil {
		return "", err
	}
	return envFile(pod), nil
}

func envFile(pod Pod) string {
	var b strings.Builder
	for _, e := range pod.Env {
		b.WriteString(e.Name + "=" + e.Value + "\n")
	}
	return b.String()
}

// RunArgs returns the arguments the wrapper passes to "docker run -d --name
// reaper-<container>-<restartCount>": labels, environment, extra flags,
// entrypoint, image, command and args.
func RunArgs(pod Pod, opts Options) ([]string, error) {
	if err := pod.Validate(); err != nil {
		return nil, err
	}
	if _, err := opts.resolve(); err != nil {
		return nil, err
	}
	return runArgs(pod, opts), nil
}

func runArgs(pod Pod, opts Options) []string {
	a := []string{
		"--label", "reaper.io/pod-namespace=" + pod.Namespace,
		"--label", "reaper.io/pod-name=" + pod.Name,
		"--label", "reaper.io/pod-uid=" + pod.UID,
		"--label", "reaper.io/container=" + pod.Container,
	}
	if len(pod.Env) > 0 {
		a = append(a, "--env-file", EnvFilePath)
	}
	a = append(a, opts.DockerRunArgs...)
	if len(pod.Command) > 0 {
		a = append(a, "--entrypoint", pod.Command[0], pod.Image)
		a = append(a, pod.Command[1:]...)
	} else {
		a = append(a, pod.Image)
	}
	return append(a, pod.Args...)
}

// WrapperConfig returns the shell file the wrapper reads (ConfigPath): the
// Pod, the options and the exit token, which is why the user-data writes
// it readable by root only.
func WrapperConfig(pod Pod, opts Options) (string, error) {
	if err := pod.Validate(); err != nil {
		return "", err
	}
	r, err := opts.resolve()
	if err != nil {
		return "", err
	}
	return wrapperConfig(pod, r), nil
}

func wrapperConfig(pod Pod, r resolved) string {
	podJSON, _ := json.Marshal(struct {
		Namespace string `json:"podNamespace"`
		Name      string `json:"podName"`
		UID       string `json:"podUID"`
		Container string `json:"container"`
	}{pod.Namespace, pod.Name, pod.UID, pod.Container})
	words := make([]string, 0, 16)
	for _, a := range runArgs(pod, r.Options) {
		words = append(words, shword(a))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Reaper workload for Pod %s/%s, read by %s.\n", pod.Namespace, pod.Name, WrapperPath)
	// Sourced, so its variables are used elsewhere; the quoting is literal on purpose.
	b.WriteString("# shellcheck shell=sh disable=SC2034,SC1003,SC2016\n")
	for _, kv := range [][2]string{
		{"REAPER_POD_NAMESPACE", shq(pod.Namespace)},
		{"REAPER_POD_NAME", shq(pod.Name)},
		{"REAPER_POD_UID", shq(pod.UID)},
		{"REAPER_CONTAINER", shq(pod.Container)},
		{"REAPER_IMAGE", shq(pod.Image)},
		{"REAPER_RESTART_POLICY", shq(pod.policy())},
		{"REAPER_MAX_RESTARTS", fmt.Sprint(r.MaxRestarts)},
		{"REAPER_SHUTDOWN_MODE", shq(r.ShutdownMode)},
		{"REAPER_POD_WRITTEN_TAG", shq(r.TagKeys.PodWritten)},
		{"REAPER_SHUTDOWN_DELAY", fmt.Sprint(r.delaySeconds)},
		{"REAPER_EXIT_LOG", shq(r.ExitLogPath)},
		{"REAPER_CLI", shq(r.ContainerCLI)},
		{"REAPER_POD_JSON", shq(string(bytes.TrimSuffix(bytes.TrimPrefix(podJSON, []byte("{")), []byte("}"))))},
		{"REAPER_EXIT_TOKEN", shq(r.ExitToken)},
	} {
		b.WriteString(kv[0] + "=" + kv[1] + "\n")
	}
	b.WriteString("# Arguments of \"run -d --name NAME\", as shell words.\n")
	b.WriteString("REAPER_RUN_ARGS=" + shq(strings.Join(words, " ")) + "\n")
	return b.String()
}

// runtimeUnit is the systemd unit of the runtime behind cli, if known.
func runtimeUnit(cli string) string {
	switch cli[strings.LastIndex(cli, "/")+1:] {
	case "docker":
		return "docker.service"
	case "nerdctl":
		return "containerd.service"
	}
	return ""
}

// Unit returns the systemd unit installed at UnitPath. systemd restarts the
// wrapper when it is killed (Restart=on-failure, 5 s later: a SIGKILL skips
// the wrapper's traps, so without a restart nothing would report the exit or
// power the host off), and the wrapper runs with OOMScoreAdjust=-900 so that
// the kernel's OOM killer takes the workload first. A restarted wrapper adopts
// the container of the current run, and never writes two lines for one exit
// or two lines with one restartCount.
func Unit(opts Options) (string, error) {
	r, err := opts.resolve()
	if err != nil {
		return "", err
	}
	return unit(r), nil
}

func unit(r resolved) string {
	var b strings.Builder
	if err := tmplUnit.Execute(&b, struct{ RuntimeUnit, Wrapper, Config string }{runtimeUnit(r.ContainerCLI), WrapperPath, ConfigPath}); err != nil {
		panic(err) // the template is fixed; covered by tests
	}
	return b.String()
}

// AgentConfig returns the CloudWatch agent configuration that ships the exit
// log to the log group, one log stream per instance, flushed every second.
//
// It sets neither logs.concurrency nor multi_line_start_pattern, which the
// wrapper's ShutdownWhenShipped relies on: without concurrency the agent
// sends the file's batches one after the other, so its saved offset reaching
// the final line's end means every earlier line is done too; and without a
// multi-line pattern the agent sends the final line at the next flush
// instead of holding it back for a continuation.
func AgentConfig(opts Options) ([]byte, error) {
	r, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	if r.LogGroup == "" {
		return nil, errNoLogGroup
	}
	return agentConfig(r), nil
}

var errNoLogGroup = errors.New("userdata: no log group: set Cluster (the default group is derived from it) or LogGroup")

func agentConfig(r resolved) []byte {
	type file struct {
		FilePath      string `json:"file_path"`
		LogGroupName  string `json:"log_group_name"`
		LogStreamName string `json:"log_stream_name"`
	}
	var c struct {
		Logs struct {
			LogsCollected struct {
				Files struct {
					CollectList []file `json:"collect_list"`
				} `json:"files"`
			} `json:"logs_collected"`
			ForceFlushInterval int `json:"force_flush_interval"`
		} `json:"logs"`
	}
	c.Logs.LogsCollected.Files.CollectList = []file{{r.ExitLogPath, r.LogGroup, "{instance_id}"}}
	c.Logs.ForceFlushInterval = 1
	out, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		panic(err) // plain strings and ints always marshal
	}
	return append(out, '\n')
}

// heredoc returns a delimiter for a quoted here-document of body: no line of
// body equals it.
func heredoc(body string) string {
	d := "REAPER_EOF"
	lines := strings.Split(body, "\n")
	for taken := true; taken; {
		taken = false
		for _, l := range lines {
			if l == d {
				d += "_"
				taken = true
				break
			}
		}
	}
	return d
}

type hereDoc struct{ Body, Delim string }

func newHereDoc(body string) hereDoc {
	if body != "" && !strings.HasSuffix(body, "\n") {
		body += "\n"
	}
	return hereDoc{Body: body, Delim: heredoc(body)}
}

// Render validates pod and opts and returns the user-data: a bash script
// for cloud-init that installs the wrapper, its configuration, the systemd
// unit and the CloudWatch agent configuration, turns on docker's
// live-restore, and starts the agent and the unit. If any step fails, the
// script powers the host off after the shutdown delay.
//
// The script does not carry opts.Cluster, but Render requires it because a
// provider calls Render to launch, and an instance launched without the
// cluster tag is never Reaper's: its exit lines are rejected and its Pod
// never gets a status from them.
func Render(pod Pod, opts Options) (string, error) {
	if err := pod.Validate(); err != nil {
		return "", err
	}
	if err := checkCluster(opts.Cluster); err != nil {
		return "", fmt.Errorf("userdata: invalid options: %w", err)
	}
	r, err := opts.resolve()
	if err != nil {
		return "", err
	}
	data := struct {
		Pod                                     Pod
		Wrapper, Config, EnvFile, Unit, Agent   hereDoc
		WrapperPath, ConfigPath, EnvFilePath    string
		UnitPath, UnitName, AgentPath, StateDir string
		ExitLog, ExitLogDir                     string
		LiveRestore                             bool
		FailMinutes                             int
	}{
		Pod:         pod,
		Wrapper:     newHereDoc(installedWrapper),
		Config:      newHereDoc(wrapperConfig(pod, r)),
		EnvFile:     newHereDoc(envFile(pod)),
		Unit:        newHereDoc(unit(r)),
		Agent:       newHereDoc(string(agentConfig(r))),
		WrapperPath: WrapperPath, ConfigPath: ConfigPath, EnvFilePath: EnvFilePath,
		UnitPath: UnitPath, UnitName: UnitName, AgentPath: AgentConfigPath, StateDir: StateDir,
		ExitLog:     r.ExitLogPath,
		ExitLogDir:  r.ExitLogPath[:strings.LastIndex(r.ExitLogPath, "/")+1],
		LiveRestore: runtimeUnit(r.ContainerCLI) == "docker.service",
		FailMinutes: (r.delaySeconds + 59) / 60,
	}
	var b strings.Builder
	if err := tmplUserdata.Execute(&b, data); err != nil {
		return "", fmt.Errorf("userdata: render: %w", err)
	}
	return b.String(), nil
}

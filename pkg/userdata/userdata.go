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
	"path"
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
	DefaultPauseImage    = "registry.k8s.io/pause:3.10"
)

// Where the user-data installs things on the instance.
const (
	WrapperPath = "/usr/local/bin/reaper-wrapper"
	ConfigPath  = "/etc/reaper/workload.conf"
	EnvFilePath = "/etc/reaper/workload.env"
	// EnvDir holds the --env-file of each container of a Pod of several,
	// named after the container (a Pod of one uses EnvFilePath).
	EnvDir          = "/etc/reaper/env"
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

// Pod is what the user-data needs of a Pod. The JSON names follow the
// Kubernetes API.
//
// Its containers come in one of two forms. Containers (with
// InitContainers, Volumes and the rest) is the Pod's spec: init containers
// in order, native sidecars, regular containers at once, shared network
// and emptyDir volumes, termination messages. The single-container fields
// (Container, Image, Command, Args, Env) are the form of earlier versions:
// one regular container, run exactly as they ran it (no termination
// message is read). A Pod sets one form or the other.
type Pod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	// Container is the container's name in the Pod spec.
	Container string `json:"container,omitempty"`
	Image     string `json:"image,omitempty"`
	// Command replaces the image's entrypoint and Args its command, as in
	// Kubernetes. Command[0] becomes --entrypoint.
	Command []string `json:"command,omitempty"`
	Args    []string `json:"args,omitempty"`
	Env     []EnvVar `json:"env,omitempty"`
	// RestartPolicy is Always, OnFailure or Never; empty means Always, as
	// Kubernetes defaults it.
	RestartPolicy string `json:"restartPolicy,omitempty"`

	// InitContainers run in order before the regular containers: each to
	// completion, or, with restartPolicy Always, as a native sidecar,
	// started and kept running until the regular containers have ended.
	InitContainers []Container `json:"initContainers,omitempty"`
	// Containers are the regular containers, started together once the
	// init containers are done.
	Containers []Container `json:"containers,omitempty"`
	// Volumes are the Pod's volumes: emptyDir only, a host directory that
	// every container mounting it shares.
	Volumes []Volume `json:"volumes,omitempty"`
	// TerminationGracePeriodSeconds is how long sidecars get between
	// SIGTERM and SIGKILL when the Pod stops them (default 30).
	TerminationGracePeriodSeconds *int64 `json:"terminationGracePeriodSeconds,omitempty"`
}

// Container is one container of the Pod's spec.
type Container struct {
	Name  string `json:"name"`
	Image string `json:"image"`
	// Command replaces the image's entrypoint and Args its command.
	Command []string `json:"command,omitempty"`
	Args    []string `json:"args,omitempty"`
	Env     []EnvVar `json:"env,omitempty"`
	// RestartPolicy, for an init container, is empty or Always (a native
	// sidecar); a regular container takes the Pod's and leaves it empty.
	RestartPolicy string        `json:"restartPolicy,omitempty"`
	VolumeMounts  []VolumeMount `json:"volumeMounts,omitempty"`
	// TerminationMessagePath is the file the container may write its
	// termination message to (default /dev/termination-log).
	TerminationMessagePath string `json:"terminationMessagePath,omitempty"`
	// TerminationMessagePolicy is File (default) or FallbackToLogsOnError.
	TerminationMessagePolicy string `json:"terminationMessagePolicy,omitempty"`
}

// VolumeMount mounts one of the Pod's volumes in a container.
type VolumeMount struct {
	Name      string `json:"name"`
	MountPath string `json:"mountPath"`
	ReadOnly  bool   `json:"readOnly,omitempty"`
}

// Volume is one of the Pod's volumes. Only emptyDir is carried: a
// directory on the host, empty at the Pod's start, gone with the instance.
type Volume struct {
	Name     string    `json:"name"`
	EmptyDir *EmptyDir `json:"emptyDir,omitempty"`
}

// EmptyDir marks an emptyDir volume. The medium is the host's disk.
type EmptyDir struct{}

// Termination message policies, as in the container spec.
const (
	TerminationMessageFile                  = "File"
	TerminationMessageFallbackToLogsOnError = "FallbackToLogsOnError"
)

// DefaultTerminationMessagePath is where a container writes its
// termination message unless its spec says otherwise.
const DefaultTerminationMessagePath = "/dev/termination-log"

// DefaultTerminationGracePeriod is the sidecars' grace, in seconds, when
// the Pod sets none.
const DefaultTerminationGracePeriod = 30

// Bounds of termination messages, the kubelet's: a container's at most
// MaxMessageBytes, the Pod's at most MaxPodMessageBytes, shared evenly by
// its containers; a log tail under FallbackToLogsOnError at most
// MaxLogMessageBytes and MaxLogMessageLines.
const (
	MaxMessageBytes    = 4096
	MaxPodMessageBytes = 12 * 1024
	MaxLogMessageBytes = 2048
	MaxLogMessageLines = 80
)

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
	// PauseImage is the image of the container whose network namespace
	// the containers of a Pod of several share (default DefaultPauseImage).
	// A Pod of one container runs without it.
	PauseImage string
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
		z, err := gzipBytes(data)
		if err != nil {
			return "", err
		}
		if len(z) > MaxUserDataBytes {
			return "", fmt.Errorf("userdata: user-data is %d bytes gzip-compressed, over EC2's %d", len(z), MaxUserDataBytes)
		}
		data = z
	}
	return base64.StdEncoding.EncodeToString(data), nil
}

// gzipBytes compresses data as cloud-init unpacks it, the same bytes for
// the same input.
func gzipBytes(data []byte) ([]byte, error) {
	var b bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
	_, _ = zw.Write(data)
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
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

// wrapperGzip is the installed wrapper as the user-data carries it:
// gzip-compressed, in base64 lines. In plain text the wrapper alone would
// take most of EC2's 16 KiB, leaving too little for the Pod.
var wrapperGzip = func() string {
	z, err := gzipBytes([]byte(installedWrapper))
	if err != nil {
		panic(err) // writing to memory does not fail
	}
	enc := base64.StdEncoding.EncodeToString(z)
	var b strings.Builder
	for len(enc) > 76 {
		b.WriteString(enc[:76] + "\n")
		enc = enc[76:]
	}
	b.WriteString(enc + "\n")
	return b.String()
}()

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
	switch p.RestartPolicy {
	case "", RestartAlways, RestartOnFailure, RestartNever:
	default:
		errs = append(errs, fmt.Errorf("restartPolicy %q is not Always, OnFailure or Never", p.RestartPolicy))
	}
	if p.specForm() {
		errs = append(errs, p.specErrors()...)
	} else {
		if !validLabel(p.Container) {
			errs = append(errs, fmt.Errorf("container %q is not a DNS label", p.Container))
		}
		errs = append(errs, containerErrors("", Container{Image: p.Image, Command: p.Command, Args: p.Args, Env: p.Env})...)
	}
	if len(errs) > 0 {
		return fmt.Errorf("userdata: invalid pod: %w", errors.Join(errs...))
	}
	return nil
}

// specForm tells whether the Pod gives its containers as its spec does
// (Containers), rather than in the single-container fields.
func (p Pod) specForm() bool { return len(p.Containers) > 0 || len(p.InitContainers) > 0 }

// specErrors checks the spec form: names, kinds, volumes and mounts, and
// that the single-container fields are left empty.
func (p Pod) specErrors() []error {
	var errs []error
	if p.Container != "" || p.Image != "" || len(p.Command) > 0 || len(p.Args) > 0 || len(p.Env) > 0 {
		errs = append(errs, errors.New("container, image, command, args and env are the single-container form: with containers, set them on each container"))
	}
	if len(p.Containers) == 0 {
		errs = append(errs, errors.New("containers is empty: a Pod needs a regular container"))
	}
	if n := len(p.InitContainers) + len(p.Containers); n > model.MaxContainers {
		errs = append(errs, fmt.Errorf("%d containers: Reaper keeps the exits of %d containers a Pod at most", n, model.MaxContainers))
	}
	if g := p.TerminationGracePeriodSeconds; g != nil && (*g < 0 || *g > 24*3600) {
		errs = append(errs, fmt.Errorf("terminationGracePeriodSeconds %d is outside 0..86400", *g))
	}
	volumes := map[string]bool{}
	for i, v := range p.Volumes {
		switch {
		case !validLabel(v.Name):
			errs = append(errs, fmt.Errorf("volumes[%d]: name %q is not a DNS label", i, v.Name))
		case volumes[v.Name]:
			errs = append(errs, fmt.Errorf("volumes[%d]: name %q is used twice", i, v.Name))
		}
		if v.EmptyDir == nil {
			errs = append(errs, fmt.Errorf("volumes[%d] (%s): only emptyDir volumes can be carried to the host", i, v.Name))
		}
		volumes[v.Name] = true
	}
	names := map[string]bool{}
	for _, c := range p.containers() {
		prefix := fmt.Sprintf("%s (%s): ", c.field, c.Name)
		switch {
		case !validLabel(c.Name):
			errs = append(errs, fmt.Errorf("%sname %q is not a DNS label", prefix, c.Name))
		case names[c.Name]:
			errs = append(errs, fmt.Errorf("%sname %q is used twice", prefix, c.Name))
		}
		names[c.Name] = true
		errs = append(errs, containerErrors(prefix, c.Container)...)
		switch {
		case c.kind == kindInit && c.RestartPolicy != "" && c.RestartPolicy != RestartAlways:
			errs = append(errs, fmt.Errorf("%srestartPolicy %q: an init container takes Always (a sidecar) or none", prefix, c.RestartPolicy))
		case c.kind == kindMain && c.RestartPolicy != "":
			errs = append(errs, fmt.Errorf("%srestartPolicy %q: a regular container follows the Pod's", prefix, c.RestartPolicy))
		}
		switch c.TerminationMessagePolicy {
		case "", TerminationMessageFile, TerminationMessageFallbackToLogsOnError:
		default:
			errs = append(errs, fmt.Errorf("%sterminationMessagePolicy %q is not File or FallbackToLogsOnError", prefix, c.TerminationMessagePolicy))
		}
		if c.TerminationMessagePath != "" && !mountPath(c.TerminationMessagePath) {
			errs = append(errs, fmt.Errorf("%sterminationMessagePath %q must be absolute, without .., ',', ':' or control characters", prefix, c.TerminationMessagePath))
		}
		paths := map[string]bool{c.messagePath(): true}
		for j, m := range c.VolumeMounts {
			switch {
			case !volumes[m.Name]:
				errs = append(errs, fmt.Errorf("%svolumeMounts[%d]: no emptyDir volume %q in the Pod", prefix, j, m.Name))
			case !mountPath(m.MountPath):
				errs = append(errs, fmt.Errorf("%svolumeMounts[%d]: mountPath %q must be absolute, without .., ',', ':' or control characters", prefix, j, m.MountPath))
			case paths[path.Clean(m.MountPath)]:
				errs = append(errs, fmt.Errorf("%svolumeMounts[%d]: mountPath %q is mounted twice", prefix, j, m.MountPath))
			}
			paths[path.Clean(m.MountPath)] = true
		}
	}
	return errs
}

// mountPath tells whether p can be a bind mount's target in docker's -v
// (colon separated) on every runtime: absolute, plain.
func mountPath(p string) bool {
	return strings.HasPrefix(p, "/") && utf8.ValidString(p) && !strings.ContainsAny(p, ":,") &&
		!slices.Contains(strings.Split(p, "/"), "..") && strings.IndexFunc(p, func(r rune) bool { return r < ' ' || r == 0x7f }) < 0
}

// containerErrors checks what runs a container: image, command, args and
// environment. prefix names the container in the spec form.
func containerErrors(prefix string, c Container) []error {
	var errs []error
	switch {
	case c.Image == "":
		errs = append(errs, errors.New(prefix+"image is empty"))
	case strings.HasPrefix(c.Image, "-") || strings.IndexFunc(c.Image, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0 || !utf8.ValidString(c.Image):
		errs = append(errs, fmt.Errorf("%simage %q is not an image reference", prefix, c.Image))
	}
	if len(c.Command) > 0 && c.Command[0] == "" {
		errs = append(errs, errors.New(prefix+"command[0] is empty"))
	}
	for i, s := range c.Command {
		if err := text(fmt.Sprintf("%scommand[%d]", prefix, i), s); err != nil {
			errs = append(errs, err)
		}
	}
	for i, s := range c.Args {
		if err := text(fmt.Sprintf("%sargs[%d]", prefix, i), s); err != nil {
			errs = append(errs, err)
		}
	}
	// The environment goes to the container through docker's --env-file
	// only, never as -e arguments, which any local user can read in the
	// docker client's command line. That file is line based and skips
	// lines starting with #.
	for i, e := range c.Env {
		switch {
		case e.Name == "" || strings.ContainsRune(e.Name, '=') || strings.IndexFunc(e.Name, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0 || !utf8.ValidString(e.Name):
			errs = append(errs, fmt.Errorf("%senv[%d] name %q is empty or has '=', spaces or control characters", prefix, i, e.Name))
		case strings.HasPrefix(e.Name, "#"):
			errs = append(errs, fmt.Errorf("%senv[%d] name %q starts with '#', which docker's --env-file reads as a comment", prefix, i, e.Name))
		}
		if err := text(fmt.Sprintf("%senv[%d] (%s) value", prefix, i, e.Name), e.Value); err != nil {
			errs = append(errs, err)
		}
		if strings.ContainsAny(e.Value, "\n\r") {
			errs = append(errs, fmt.Errorf("%senv[%d] (%s) value contains a line break, which docker's --env-file cannot carry", prefix, i, e.Name))
		}
	}
	return errs
}

// The kinds of container the wrapper runs (REAPER_C<n>_KIND).
const (
	kindInit    = "init"
	kindSidecar = "sidecar"
	kindMain    = "main"
)

// podContainer is one container of the Pod as the wrapper runs it.
type podContainer struct {
	Container
	kind  string
	field string // where the spec has it, for errors
	// message tells whether its termination message is read: always in the
	// spec form, never in the single-container one.
	message bool
}

func (c podContainer) messagePath() string {
	if c.TerminationMessagePath == "" {
		return DefaultTerminationMessagePath
	}
	return path.Clean(c.TerminationMessagePath)
}

func (c podContainer) messagePolicy() string {
	if !c.message {
		return ""
	}
	if c.TerminationMessagePolicy == "" {
		return TerminationMessageFile
	}
	return c.TerminationMessagePolicy
}

// containers lists the Pod's containers in spec order: init containers
// (sidecars among them), then regular ones.
func (p Pod) containers() []podContainer {
	if !p.specForm() {
		return []podContainer{{Container: Container{Name: p.Container, Image: p.Image, Command: p.Command, Args: p.Args, Env: p.Env},
			kind: kindMain, field: "container"}}
	}
	out := make([]podContainer, 0, len(p.InitContainers)+len(p.Containers))
	for i, c := range p.InitContainers {
		k := kindInit
		if c.RestartPolicy == RestartAlways {
			k = kindSidecar
		}
		out = append(out, podContainer{Container: c, kind: k, field: fmt.Sprintf("initContainers[%d]", i), message: true})
	}
	for i, c := range p.Containers {
		out = append(out, podContainer{Container: c, kind: kindMain, field: fmt.Sprintf("containers[%d]", i), message: true})
	}
	return out
}

// messageMax is each container's share of the Pod's termination messages.
func (p Pod) messageMax() int {
	return min(MaxMessageBytes, MaxPodMessageBytes/len(p.containers()))
}

func (p Pod) grace() int64 {
	if p.TerminationGracePeriodSeconds == nil {
		return DefaultTerminationGracePeriod
	}
	return *p.TerminationGracePeriodSeconds
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
	if o.PauseImage == "" {
		o.PauseImage = DefaultPauseImage
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
	return append(errs, containerErrors("pause ", Container{Image: o.PauseImage})...)
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

// EnvFile returns the --env-file the user-data writes at EnvFilePath for a
// Pod of one container: one NAME=value line per variable ("" when there is
// none, and for a Pod of several containers, whose files EnvFiles gives).
func EnvFile(pod Pod) (string, error) {
	if err := pod.Validate(); err != nil {
		return "", err
	}
	if cs := pod.containers(); len(cs) == 1 {
		return envFile(cs[0].Env), nil
	}
	return "", nil
}

// EnvFiles returns every --env-file the user-data writes, by path: the
// one at EnvFilePath for a Pod of one container, one under EnvDir per
// container with an environment for a Pod of several.
func EnvFiles(pod Pod) (map[string]string, error) {
	if err := pod.Validate(); err != nil {
		return nil, err
	}
	out := map[string]string{}
	cs := pod.containers()
	for _, c := range cs {
		if len(c.Env) > 0 {
			out[envPath(c, len(cs))] = envFile(c.Env)
		}
	}
	return out, nil
}

func envFile(env []EnvVar) string {
	var b strings.Builder
	for _, e := range env {
		b.WriteString(e.Name + "=" + e.Value + "\n")
	}
	return b.String()
}

// envPath is where container c of a Pod of n containers finds its
// environment.
func envPath(c podContainer, n int) string {
	if n == 1 {
		return EnvFilePath
	}
	return EnvDir + "/" + c.Name
}

// pauseName is the container whose network namespace the Pod's containers
// share.
const pauseName = "reaper-pause"

// stateDirOf is the state directory of container c of a Pod of n
// containers on a host: the state directory itself for a Pod of one.
func stateDirOf(c podContainer, n int) string {
	if n == 1 {
		return StateDir
	}
	return StateDir + "/c/" + c.Name
}

// runWord is one argument of docker run: literal, or a path under the
// wrapper's state directory (under "state") or the container's (under
// "cs"), which the wrapper's shell expands, so that a host with another
// REAPER_STATE_DIR mounts its own.
type runWord struct{ s, under string }

func (w runWord) shell() string {
	if w.under == "" {
		return shword(w.s)
	}
	return `"$` + w.under + `"` + shq(w.s)
}

func (w runWord) onHost(state, cs string) string {
	switch w.under {
	case "state":
		return state + w.s
	case "cs":
		return cs + w.s
	}
	return w.s
}

func lit(ss ...string) []runWord {
	out := make([]runWord, len(ss))
	for i, s := range ss {
		out[i] = runWord{s: s}
	}
	return out
}

// usesPause tells whether the Pod's containers share a pause container's
// network: with more than one container, unless they all share the
// host's (DockerRunArgs with AllowHostNetwork).
func usesPause(pod Pod, opts Options) bool {
	if len(pod.containers()) < 2 {
		return false
	}
	for i := range opts.DockerRunArgs {
		if _, host := hostNetwork(opts.DockerRunArgs, i); host {
			return false
		}
	}
	return true
}

// splitNetwork separates the network flags (--network, --net, with their
// values) from the other arguments.
func splitNetwork(args []string) (network, rest []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case (a == "--network" || a == "--net") && i+1 < len(args):
			network = append(network, a, args[i+1])
			i++
		case strings.HasPrefix(a, "--network=") || strings.HasPrefix(a, "--net="):
			network = append(network, a)
		default:
			rest = append(rest, a)
		}
	}
	return network, rest
}

// RunArgs returns the arguments the wrapper passes to "docker run -d --name
// reaper-<container>-<restartCount>" for the Pod's first regular container
// (the only one of a Pod of one), as on a host with the default state
// directory: labels, environment, mounts, network, extra flags,
// entrypoint, image, command and args. ContainerRunArgs gives any
// container's.
func RunArgs(pod Pod, opts Options) ([]string, error) {
	if err := pod.Validate(); err != nil {
		return nil, err
	}
	for _, c := range pod.containers() {
		if c.kind == kindMain {
			return ContainerRunArgs(pod, opts, c.Name)
		}
	}
	return nil, errors.New("userdata: the Pod has no regular container")
}

// ContainerRunArgs is RunArgs for the Pod's container named name.
func ContainerRunArgs(pod Pod, opts Options, name string) ([]string, error) {
	if err := pod.Validate(); err != nil {
		return nil, err
	}
	if _, err := opts.resolve(); err != nil {
		return nil, err
	}
	cs := pod.containers()
	for _, c := range cs {
		if c.Name == name {
			var out []string
			for _, w := range runWords(pod, c, opts) {
				out = append(out, w.onHost(StateDir, stateDirOf(c, len(cs))))
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("userdata: the Pod has no container %q", name)
}

func runWords(pod Pod, c podContainer, opts Options) []runWord {
	a := lit(
		"--label", "reaper.io/pod-namespace="+pod.Namespace,
		"--label", "reaper.io/pod-name="+pod.Name,
		"--label", "reaper.io/pod-uid="+pod.UID,
		"--label", "reaper.io/container="+c.Name,
	)
	n := len(pod.containers())
	if len(c.Env) > 0 {
		a = append(a, lit("--env-file", envPath(c, n))...)
	}
	for _, m := range c.VolumeMounts {
		spec := "/volumes/" + m.Name + ":" + path.Clean(m.MountPath)
		if m.ReadOnly {
			spec += ":ro"
		}
		a = append(a, runWord{s: "-v"}, runWord{s: spec, under: "state"})
	}
	if c.message {
		// A file per container, as the kubelet mounts one: the wrapper
		// reads it when the container has ended.
		a = append(a, runWord{s: "-v"}, runWord{s: "/termination-log:" + c.messagePath(), under: "cs"})
	}
	extra := opts.DockerRunArgs
	if usesPause(pod, opts) {
		_, extra = splitNetwork(extra)
		a = append(a, lit("--network", "container:"+pauseName)...)
	}
	a = append(a, lit(extra...)...)
	if len(c.Command) > 0 {
		a = append(a, lit("--entrypoint", c.Command[0], c.Image)...)
		a = append(a, lit(c.Command[1:]...)...)
	} else {
		a = append(a, lit(c.Image)...)
	}
	return append(a, lit(c.Args...)...)
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

func shellWords(ws []runWord) string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.shell()
	}
	return strings.Join(out, " ")
}

func wrapperConfig(pod Pod, r resolved) string {
	podJSON, _ := json.Marshal(struct {
		Namespace string `json:"podNamespace"`
		Name      string `json:"podName"`
		UID       string `json:"podUID"`
	}{pod.Namespace, pod.Name, pod.UID})
	cs := pod.containers()
	var b strings.Builder
	fmt.Fprintf(&b, "# Reaper workload for Pod %s/%s, read by %s.\n", pod.Namespace, pod.Name, WrapperPath)
	// Sourced, so its variables are used elsewhere; the quoting is literal on purpose.
	b.WriteString("# shellcheck shell=sh disable=SC2034,SC1003,SC2016\n")
	set := func(k, v string) { b.WriteString(k + "=" + v + "\n") }
	for _, kv := range [][2]string{
		{"REAPER_POD_NAMESPACE", shq(pod.Namespace)},
		{"REAPER_POD_NAME", shq(pod.Name)},
		{"REAPER_POD_UID", shq(pod.UID)},
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
		set(kv[0], kv[1])
	}
	if pod.specForm() {
		set("REAPER_GRACE", fmt.Sprint(pod.grace()))
		set("REAPER_MSG_MAX", fmt.Sprint(pod.messageMax()))
	}
	if len(pod.Volumes) > 0 {
		names := make([]string, len(pod.Volumes))
		for i, v := range pod.Volumes {
			names[i] = v.Name
		}
		set("REAPER_VOLUMES", shq(strings.Join(names, " ")))
	}
	if usesPause(pod, r.Options) {
		network, _ := splitNetwork(r.DockerRunArgs)
		words := lit("--label", "reaper.io/pod-namespace="+pod.Namespace, "--label", "reaper.io/pod-name="+pod.Name,
			"--label", "reaper.io/pod-uid="+pod.UID)
		words = append(append(words, lit(network...)...), lit(r.PauseImage)...)
		b.WriteString("# The container whose network the Pod's containers share.\n")
		set("REAPER_PAUSE_IMAGE", shq(r.PauseImage))
		set("REAPER_PAUSE_RUN_ARGS", shq(shellWords(words)))
	}
	set("REAPER_CONTAINERS", fmt.Sprint(len(cs)))
	for i, c := range cs {
		v := fmt.Sprintf("REAPER_C%d_", i+1)
		fmt.Fprintf(&b, "# %s: %s. Arguments of \"run -d --name NAME\", as shell words.\n", c.field, c.kind)
		set(v+"NAME", shq(c.Name))
		set(v+"KIND", c.kind)
		set(v+"IMAGE", shq(c.Image))
		set(v+"MSG", shq(c.messagePolicy()))
		set(v+"RUN_ARGS", shq(shellWords(runWords(pod, c, r.Options))))
	}
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
	type envFileDoc struct {
		Path string
		Doc  hereDoc
	}
	cs := pod.containers()
	var envs []envFileDoc
	envDir := ""
	for _, c := range cs {
		if len(c.Env) > 0 {
			envs = append(envs, envFileDoc{envPath(c, len(cs)), newHereDoc(envFile(c.Env))})
			if len(cs) > 1 {
				envDir = EnvDir
			}
		}
	}
	data := struct {
		Pod                                     Pod
		Config, Unit, Agent                     hereDoc
		WrapperGzip                             hereDoc
		EnvFiles                                []envFileDoc
		WrapperPath, ConfigPath, EnvDir         string
		UnitPath, UnitName, AgentPath, StateDir string
		ExitLog, ExitLogDir                     string
		LiveRestore                             bool
		FailMinutes                             int
	}{
		Pod:         pod,
		WrapperGzip: newHereDoc(wrapperGzip),
		Config:      newHereDoc(wrapperConfig(pod, r)),
		EnvFiles:    envs,
		Unit:        newHereDoc(unit(r)),
		Agent:       newHereDoc(string(agentConfig(r))),
		WrapperPath: WrapperPath, ConfigPath: ConfigPath, EnvDir: envDir,
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
	script := b.String()
	if n := len(script); n > MaxUserDataBytes {
		if z := gzipLen(script); z > MaxUserDataBytes {
			return "", fmt.Errorf("userdata: the Pod's user-data is %d bytes, %d gzip-compressed, over EC2's %d: "+
				"shorten the environment, command and args of its %d containers, or pass large data another way (an image, a volume)",
				n, z, MaxUserDataBytes, len(cs))
		}
	}
	return script, nil
}

// gzipLen is the size of s gzip-compressed as EncodeUserData compresses it.
func gzipLen(s string) int {
	z, err := gzipBytes([]byte(s))
	if err != nil {
		return len(s)
	}
	return len(z)
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/reaper-k8s/reaper/internal/cli"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/userdata"
)

func init() {
	cli.Register("userdata", cli.Command{
		Summary: "render a Pod's user-data, wrapper, agent configuration, tags or launch settings",
		Run:     runUserdata,
	})
}

// userdataList is a repeatable string flag.
type userdataList []string

func (l *userdataList) String() string     { return strings.Join(*l, " ") }
func (l *userdataList) Set(v string) error { *l = append(*l, v); return nil }

const userdataUsage = `usage: reaper userdata -cluster NAME [-f pod.json] [flags]

Renders what a provider puts on the instance of one Pod. The Pod comes from
-f (a JSON object with the fields of userdata.Pod; "-" reads stdin), and/or
from flags, which override the file. One container: container, image,
command, args, env [{name, value}], restartPolicy (the flags set these). A
Pod as its spec gives it: initContainers and containers (each with name,
image, command, args, env, restartPolicy "Always" for a sidecar,
volumeMounts [{name, mountPath, readOnly}], terminationMessagePath,
terminationMessagePolicy), volumes [{name, emptyDir: {}}],
terminationGracePeriodSeconds, restartPolicy. -o run-args prints the first
regular container's arguments. -cluster names the Pod's
cluster (REAPER_CLUSTER of its Reaper deployment); userdata, tags and launch
need it. -cluster-uid adds the cluster identity tag: the UID of the cluster's
kube-system namespace. Reaper treats an instance as an orphan only when that
tag equals the identity of the apiserver it reaches.

-exit-token-file names a file holding the launch's exit token, a secret of
32 to 128 letters, digits, - and _ (openssl rand -hex 32 makes one): a new
one for every launch, and the same file for every output of that launch.
-o userdata and -o config put it in the wrapper's configuration, which puts
it in every exit line; -o tags gives its hash, as the exit-token tag, and
Reaper then believes a line for the instance only when it carries the token.
Without the file -o launch draws a token itself, and the other outputs
carry none: the instance then keeps the checks of the other tags alone.

-shutdown-mode says when the host powers itself off after the Pod's final
exit line:
  when-shipped      once the CloudWatch agent has shipped the line (default)
  when-pod-written  once Reaper has tagged the instance after writing the Pod
                    (for a provider that derives the Pod's status from the
                    instance): needs -tag-key-pod-written, the
                    REAPER_TAG_POD_WRITTEN of the Reaper deployment, and
                    every -tag-key-* free of "/" (the instance metadata
                    cannot show such keys); -o launch then enables the
                    instance's tags in its metadata
  after-delay       after -shutdown-delay, leaving the instance to Reaper
In every mode the host powers off after -shutdown-delay at the latest.

-o selects the output:
  userdata      the user-data script (default)
  wrapper       /usr/local/bin/reaper-wrapper
  config        /etc/reaper/workload.conf
  env-file      /etc/reaper/workload.env
  unit          reaper-workload.service
  agent-config  the CloudWatch agent configuration
  run-args      the docker run arguments, as JSON
  tags          the instance tags, as JSON
  launch        all launch settings (user-data, base64, tags, shutdown behavior,
                metadata options), as JSON

flags:
`

func runUserdata(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("userdata", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), userdataUsage)
		fs.PrintDefaults()
	}
	var (
		file, output, out                                     string
		namespace, name, uid, container, image, pol           string
		opts                                                  userdata.Options
		command, podArgs, env, runArgs                        userdataList
		tagManaged, tagNamespace, tagName, tagUID, tagCluster string
		tagClusterUID, tagExitToken, tagPodWritten            string
		exitTokenFile                                         string
	)
	fs.StringVar(&file, "f", "", "Pod JSON file (- for stdin)")
	fs.StringVar(&output, "o", "userdata", "what to print (see above)")
	fs.StringVar(&out, "out", "", "write to this file instead of stdout")
	fs.StringVar(&namespace, "namespace", "", "Pod namespace")
	fs.StringVar(&name, "name", "", "Pod name")
	fs.StringVar(&uid, "uid", "", "Pod UID")
	fs.StringVar(&container, "container", "", "container name")
	fs.StringVar(&image, "image", "", "container image")
	fs.Var(&command, "command", "one word of the container command (repeat; replaces the entrypoint)")
	fs.Var(&podArgs, "arg", "one container argument (repeat)")
	fs.Var(&env, "env", "NAME=VALUE environment variable (repeat)")
	fs.StringVar(&pol, "restart-policy", "", "Always (default), OnFailure or Never")
	fs.StringVar(&opts.Cluster, "cluster", "", "the Pod's cluster, for the cluster tag (required for userdata, tags and launch)")
	fs.StringVar(&opts.ClusterUID, "cluster-uid", "",
		"the UID of the cluster's kube-system namespace, for the cluster identity tag (kubectl get namespace kube-system -o jsonpath='{.metadata.uid}'); "+
			"without it Reaper never terminates the instance as an orphan")
	fs.StringVar(&exitTokenFile, "exit-token-file", "",
		"file holding the launch's exit token (see above); without it -o launch draws one and the other outputs carry none")
	fs.StringVar(&opts.LogGroup, "log-group", "", "CloudWatch Logs group for exit lines (default /reaper/<cluster>/exits)")
	fs.StringVar(&opts.ExitLogPath, "exit-log", userdata.DefaultExitLogPath, "exit log file on the instance")
	fs.StringVar(&opts.ContainerCLI, "container-cli", userdata.DefaultContainerCLI, "docker-compatible CLI on the instance")
	fs.IntVar(&opts.MaxRestarts, "max-restarts", 0, "cap on in-place restarts (0: unlimited)")
	fs.StringVar(&opts.ShutdownMode, "shutdown-mode", userdata.ShutdownWhenShipped,
		"when the host powers off after the final exit: "+userdata.ShutdownWhenShipped+", "+userdata.ShutdownWhenPodWritten+" or "+userdata.ShutdownAfterDelay+" (see above)")
	fs.DurationVar(&opts.ShutdownDelay, "shutdown-delay", userdata.DefaultShutdownDelay, "power off this long after the final exit at the latest, if still running")
	fs.Var(&runArgs, "docker-run-arg", "extra docker run argument (repeat, e.g. -docker-run-arg=--gpus -docker-run-arg=all)")
	fs.StringVar(&opts.PauseImage, "pause-image", userdata.DefaultPauseImage,
		"image of the container whose network a Pod's containers share (a Pod of several containers)")
	fs.BoolVar(&opts.AllowHostNetwork, "allow-host-network", false,
		"allow -docker-run-arg=--network=host (or --net host): the workload then gets the instance role's credentials from IMDS")
	fs.StringVar(&tagManaged, "tag-key-managed", model.DefaultTagManaged, "tag key marking managed instances")
	fs.StringVar(&tagNamespace, "tag-key-namespace", model.DefaultTagPodNamespace, "tag key for the Pod namespace")
	fs.StringVar(&tagName, "tag-key-name", model.DefaultTagPodName, "tag key for the Pod name")
	fs.StringVar(&tagUID, "tag-key-uid", model.DefaultTagPodUID, "tag key for the Pod UID")
	fs.StringVar(&tagCluster, "tag-key-cluster", model.DefaultTagCluster, "tag key for the cluster")
	fs.StringVar(&tagClusterUID, "tag-key-cluster-uid", model.DefaultTagClusterUID, "tag key for the cluster identity")
	fs.StringVar(&tagExitToken, "tag-key-exit-token", model.DefaultTagExitToken, "tag key for the exit token's hash")
	fs.StringVar(&tagPodWritten, "tag-key-pod-written", "",
		"tag key Reaper puts on the instance once it has written the Pod (REAPER_TAG_POD_WRITTEN); -shutdown-mode "+userdata.ShutdownWhenPodWritten+" waits for it")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}

	var pod userdata.Pod
	if file != "" {
		var err error
		if pod, err = readPodFile(file); err != nil {
			return err
		}
	}
	// Flags given on the command line override the file.
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for flagName, f := range map[string]struct {
		dst *string
		v   string
	}{
		"namespace": {&pod.Namespace, namespace}, "name": {&pod.Name, name}, "uid": {&pod.UID, uid},
		"container": {&pod.Container, container}, "image": {&pod.Image, image}, "restart-policy": {&pod.RestartPolicy, pol},
	} {
		if set[flagName] {
			*f.dst = f.v
		}
	}
	if set["command"] {
		pod.Command = command
	}
	if set["arg"] {
		pod.Args = podArgs
	}
	if set["env"] {
		pod.Env = nil
		for _, kv := range env {
			n, v, ok := strings.Cut(kv, "=")
			if !ok {
				return fmt.Errorf("-env %q: want NAME=VALUE", kv)
			}
			pod.Env = append(pod.Env, userdata.EnvVar{Name: n, Value: v})
		}
	}
	opts.DockerRunArgs = runArgs
	opts.TagKeys = model.TagKeys{Managed: tagManaged, PodNamespace: tagNamespace, PodName: tagName, PodUID: tagUID, Cluster: tagCluster,
		ClusterUID: tagClusterUID, ExitToken: tagExitToken, PodWritten: tagPodWritten}
	if exitTokenFile != "" {
		b, err := os.ReadFile(exitTokenFile)
		if err != nil {
			return err
		}
		opts.ExitToken = strings.TrimSpace(string(b))
	}
	if opts.Cluster == "" && (output == "userdata" || output == "tags" || output == "launch") {
		return fmt.Errorf("-o %s needs -cluster: the name of the Pod's cluster, as in REAPER_CLUSTER of its Reaper deployment", output)
	}

	text, err := renderUserdataOutput(output, pod, opts)
	if err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "userdata: "))
	}
	if out == "" {
		_, err = io.WriteString(os.Stdout, text)
		return err
	}
	mode := os.FileMode(0o644)
	if output == "userdata" || output == "config" || output == "env-file" || output == "launch" {
		mode = 0o600 // the container's environment, the exit token
	}
	return os.WriteFile(out, []byte(text), mode)
}

func readPodFile(path string) (userdata.Pod, error) {
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(os.Stdin)
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return userdata.Pod{}, err
	}
	var pod userdata.Pod
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&pod); err != nil {
		return userdata.Pod{}, fmt.Errorf("%s: %w", path, err)
	}
	return pod, nil
}

func renderUserdataOutput(output string, pod userdata.Pod, opts userdata.Options) (string, error) {
	asJSON := func(v any) (string, error) {
		b, err := json.MarshalIndent(v, "", "  ")
		return string(b) + "\n", err
	}
	if output != "wrapper" && output != "unit" && output != "agent-config" {
		if err := pod.Validate(); err != nil {
			return "", err
		}
	}
	switch output {
	case "userdata":
		return userdata.Render(pod, opts)
	case "wrapper":
		return userdata.Wrapper(), nil
	case "config":
		return userdata.WrapperConfig(pod, opts)
	case "env-file":
		return userdata.EnvFile(pod)
	case "unit":
		return userdata.Unit(opts)
	case "agent-config":
		b, err := userdata.AgentConfig(opts)
		return string(b), err
	case "run-args":
		a, err := userdata.RunArgs(pod, opts)
		if err != nil {
			return "", err
		}
		return asJSON(a)
	case "tags":
		// Checked as Launch checks them (the cluster, the tag keys), but
		// with no token drawn: its secret would be lost, and the user-data
		// would not carry it.
		if _, err := userdata.Render(pod, opts); err != nil {
			return "", err
		}
		return asJSON(userdata.Tags(pod, opts))
	case "launch":
		ls, err := userdata.Launch(pod, opts)
		if err != nil {
			return "", err
		}
		return asJSON(ls)
	}
	return "", fmt.Errorf("-o %q: want userdata, wrapper, config, env-file, unit, agent-config, run-args, tags or launch", output)
}

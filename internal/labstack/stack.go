// Package labstack is the lab's local stack: it runs the real dependencies of Reaper on loopback for
// integration tests and `make replay`: etcd plus kube-apiserver (and, on
// request, kube-controller-manager), dynalite (DynamoDB), in-process EC2
// Query API and SQS JSON API servers, and the Lambda runtime interface emulator for the
// function binaries.
//
// Binaries come from the environment printed by hack/setup.sh
// (REAPER_ETCD, REAPER_KUBE_APISERVER, REAPER_KUBE_CONTROLLER_MANAGER,
// REAPER_DYNALITE, REAPER_RIE). Every process listens on a free 127.0.0.1
// port, runs in its own temporary directory with its output in a log file
// there, and dies with the test binary (Linux). Nothing listens on a
// default port, so a system etcd on 2379 does not interfere.
package labstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/sqsserver"
)

// Part selects a component of the stack.
type Part uint8

// The parts of a Stack.
const (
	Kube   Part = 1 << iota // etcd and kube-apiserver
	Dynamo                  // dynalite
	EC2                     // in-process ec2server
	SQS                     // in-process sqsserver
	All    = Kube | Dynamo | EC2 | SQS
)

// Cluster is the name of the stack's Kubernetes cluster: the REAPER_CLUSTER
// Reaper's functions run with, and the cluster tag of the instances they own.
const Cluster = "reaper-local"

// Region and the dummy credentials every AWS client of the stack uses.
const (
	Region          = "us-east-1"
	AccessKeyID     = "AKIDLOCALSTACK"
	SecretAccessKey = "labstack-secret"
)

// Options configures Start. The zero value starts everything.
type Options struct {
	// Parts to start; zero means All.
	Parts Part
	// Namespaces to create besides "default".
	Namespaces []string
	// Controllers are the kube-controller-manager controllers to run, by
	// canonical name (the one in its /healthz, e.g. "job-controller",
	// "garbage-collector-controller"); empty runs no controller-manager.
	// They need the Kube part. Start waits until the controller-manager
	// reports each one healthy.
	Controllers []string
	// ReadyTimeout bounds the wait for each process to answer; default 60s.
	ReadyTimeout time.Duration
	// KeepDir leaves Dir (logs, kubeconfig, keys, etcd data) after Stop.
	KeepDir bool
}

// Stack is a running local stack. Fields of parts that were not started are
// zero.
type Stack struct {
	// Dir holds the logs (<process>.log), the kubeconfig, the keys and
	// the etcd data.
	Dir string

	// KubeconfigPath is a kubeconfig for a system:masters user (token auth,
	// TLS verified against the stack's own CA).
	KubeconfigPath string
	// Kube is a client for the apiserver.
	Kube kubernetes.Interface

	// DynamoEndpoint is the dynalite URL, e.g. http://127.0.0.1:41234.
	DynamoEndpoint string

	// EC2 is the fake EC2 endpoint; seed instances and inject faults on it.
	EC2 *ec2server.Server
	// SQS is the SQS endpoint the work queues live on.
	SQS *sqsserver.Server

	opts       Options
	restConfig *rest.Config
	// reaperToken authenticates ReaperRESTConfig's user.
	reaperToken string

	mu                sync.Mutex
	etcd              *process
	apiserver         *process
	apiserverBin      string
	apiserverArgs     []string
	controllerManager *process
	dynalite          *process
	stopped           bool
}

// Start launches the selected parts and waits until each one answers. On
// error everything already started is stopped again; the working directory
// is kept, since the error points at the logs in it.
func Start(ctx context.Context, opts Options) (*Stack, error) {
	if opts.Parts == 0 {
		opts.Parts = All
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 60 * time.Second
	}
	if err := checkControllers(opts); err != nil {
		return nil, err
	}
	bins, err := lookupBinaries(opts)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "reaper-stack-")
	if err != nil {
		return nil, err
	}
	s := &Stack{Dir: dir, opts: opts}

	// dynalite boots in parallel with etcd and the apiserver.
	var wg sync.WaitGroup
	var dynErr error
	if opts.Parts&Dynamo != 0 {
		wg.Go(func() { dynErr = retryPorts(func() error { return s.startDynalite(ctx, bins) }) })
	}
	var kubeErr error
	if opts.Parts&Kube != 0 {
		kubeErr = s.startKube(ctx, bins)
	}
	wg.Wait()
	if opts.Parts&EC2 != 0 {
		s.EC2 = ec2server.New()
	}
	if opts.Parts&SQS != 0 {
		s.SQS = sqsserver.New()
	}
	if err := errors.Join(kubeErr, dynErr); err != nil {
		s.opts.KeepDir = true
		s.Stop()
		return nil, fmt.Errorf("labstack: %w", err)
	}
	return s, nil
}

// checkControllers catches Options.Controllers that Start could only time
// out on: readiness looks for each name among the controller-manager's
// health checks, which carry canonical names ("job-controller"), not the
// short aliases ("job") that --controllers also accepts.
func checkControllers(opts Options) error {
	if len(opts.Controllers) > 0 && opts.Parts&Kube == 0 {
		return errors.New("labstack: Options.Controllers needs the Kube part")
	}
	for _, name := range opts.Controllers {
		if !strings.HasSuffix(name, "-controller") {
			return fmt.Errorf("labstack: Options.Controllers: %q is not a canonical controller name (like job-controller)", name)
		}
	}
	return nil
}

type binaries struct{ etcd, apiserver, controllerManager, node, dynalite string }

// lookupBinaries checks every tool the parts need up front, so one error
// lists everything that is missing.
func lookupBinaries(opts Options) (binaries, error) {
	parts := opts.Parts
	var b binaries
	var errs []error
	get := func(dst *string, env string) {
		var err error
		if *dst, err = binary(env); err != nil {
			errs = append(errs, err)
		}
	}
	if parts&Kube != 0 {
		get(&b.etcd, "REAPER_ETCD")
		get(&b.apiserver, "REAPER_KUBE_APISERVER")
		if len(opts.Controllers) > 0 {
			get(&b.controllerManager, "REAPER_KUBE_CONTROLLER_MANAGER")
		}
	}
	if parts&Dynamo != 0 {
		get(&b.dynalite, "REAPER_DYNALITE")
		var err error
		if b.node, err = exec.LookPath("node"); err != nil {
			errs = append(errs, fmt.Errorf("dynalite needs node on PATH: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return b, fmt.Errorf("labstack: %w", err)
	}
	return b, nil
}

func (s *Stack) startDynalite(ctx context.Context, bins binaries) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	p, err := launch("dynalite", s.Dir, os.Environ(), bins.node, bins.dynalite,
		"--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0")
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.dynalite = p
	s.mu.Unlock()
	endpoint := "http://" + hostPort(port)
	// Any HTTP answer means it is serving; a bare GET gets a DynamoDB error.
	err = p.waitReady(ctx, s.opts.ReadyTimeout, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	})
	if err != nil {
		return err
	}
	s.DynamoEndpoint = endpoint
	return nil
}

func (s *Stack) startKube(ctx context.Context, bins binaries) error {
	secrets, err := writeKubeSecrets(s.Dir)
	if err != nil {
		return fmt.Errorf("kube keys: %w", err)
	}
	var etcdURL string
	err = retryPorts(func() (err error) {
		etcdURL, err = s.startEtcd(ctx, bins.etcd)
		return err
	})
	if err != nil {
		return err
	}

	err = retryPorts(func() error {
		port, err := freePort()
		if err != nil {
			return err
		}
		if err := s.configureKube("https://"+hostPort(port), secrets); err != nil {
			return err
		}
		s.apiserverBin = bins.apiserver
		s.apiserverArgs = []string{
			"--etcd-servers=" + etcdURL,
			"--bind-address=127.0.0.1",
			"--advertise-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			// Serving certificate from our CA: no --cert-dir self-signing,
			// and clients verify TLS.
			"--tls-cert-file=" + secrets.certFile,
			"--tls-private-key-file=" + secrets.keyFile,
			"--token-auth-file=" + secrets.tokenFile,
			"--authorization-mode=RBAC",
			// Nothing maintains the kubernetes Service endpoints, and
			// nothing mints service account tokens (a controller-manager
			// from Options.Controllers gets no signing key).
			"--endpoint-reconciler-type=none",
			"--disable-admission-plugins=ServiceAccount",
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + secrets.saKeyFile,
			"--service-account-signing-key-file=" + secrets.saKeyFile,
			"--service-cluster-ip-range=10.0.0.0/24",
			"--allow-privileged=true",
			"--profiling=false",
			// The watch cache relies on etcd progress requests, which the
			// Debian etcd 3.4 lacks: cached watches then fail with "Too large
			// resource version". Serving watches from etcd directly works.
			"--watch-cache=false",
		}
		return s.StartAPIServer(ctx)
	})
	if err != nil {
		return err
	}
	if err := s.EnsureNamespaces(ctx, append([]string{"default"}, s.opts.Namespaces...)...); err != nil {
		return err
	}
	if len(s.opts.Controllers) == 0 {
		return nil
	}
	return retryPorts(func() error { return s.startControllerManager(ctx, bins.controllerManager, secrets) })
}

// startControllerManager runs kube-controller-manager with only
// Options.Controllers, as the kubeconfig's system:masters user.
func (s *Stack) startControllerManager(ctx context.Context, bin string, secrets *kubeSecrets) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	args := []string{
		"--kubeconfig=" + s.KubeconfigPath,
		"--controllers=" + strings.Join(s.opts.Controllers, ","),
		// A single instance: no lease to acquire before the controllers
		// start.
		"--leader-elect=false",
		// Per-controller service account credentials would need the token
		// controller, and the stack mints no tokens.
		"--use-service-account-credentials=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		// Serving certificate from our CA, so the readiness probe verifies
		// TLS like every other client of the stack.
		"--tls-cert-file=" + secrets.certFile,
		"--tls-private-key-file=" + secrets.keyFile,
	}
	// Without --authentication-kubeconfig it looks for an in-cluster
	// config to authenticate requests to its own endpoints: in a CI Pod
	// that would be a real cluster. Anonymous /healthz is all the stack uses.
	env := filterEnv(os.Environ(), "KUBERNETES_SERVICE_")
	p, err := launch("kube-controller-manager", s.Dir, env, bin, args...)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.controllerManager = p
	s.mu.Unlock()

	hc, err := rest.HTTPClientFor(rest.AnonymousClientConfig(s.restConfig))
	if err != nil {
		return err
	}
	healthz := "https://" + hostPort(port) + "/healthz?verbose"
	return p.waitReady(ctx, s.opts.ReadyTimeout, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, healthz, nil)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		// /healthz answers ok as soon as it serves; each controller adds
		// its own check only once it is built, after the controller-manager
		// has reached the apiserver.
		for _, name := range s.opts.Controllers {
			if !bytes.Contains(body, []byte("[+]"+name+" ok\n")) {
				return fmt.Errorf("no passing check %s yet in /healthz:\n%s", name, body)
			}
		}
		return nil
	})
}

func (s *Stack) startEtcd(ctx context.Context, bin string) (string, error) {
	clientPort, err := freePort()
	if err != nil {
		return "", err
	}
	peerPort, err := freePort()
	if err != nil {
		return "", err
	}
	// A fresh data dir per attempt: one left by an attempt that lost a
	// port race would remember the old peer URL.
	dataDir := filepath.Join(s.Dir, "etcd-data")
	if err := os.RemoveAll(dataDir); err != nil {
		return "", err
	}
	if err := os.Mkdir(dataDir, 0o700); err != nil {
		return "", err
	}
	clientURL := "http://" + hostPort(clientPort)
	peerURL := "http://" + hostPort(peerPort)
	args := []string{
		"--name=reaper",
		"--data-dir=" + dataDir,
		"--listen-client-urls=" + clientURL,
		"--advertise-client-urls=" + clientURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=reaper=" + peerURL,
		"--logger=zap",
		"--log-outputs=stderr",
		// One member and no peers: a short election timeout only makes it
		// elect itself sooner (about 0.5 s saved on start).
		"--heartbeat-interval=10",
		"--election-timeout=100",
	}
	// Durability is pointless for a throwaway store. The Debian etcd (3.4)
	// lacks the flag; there fsync to the temp dir costs little.
	if etcdHasNoFsync(bin) {
		args = append(args, "--unsafe-no-fsync")
	}
	// ETCD_* variables configure etcd too; a developer's must not leak in.
	env := filterEnv(os.Environ(), "ETCD_")
	p, err := launch("etcd", s.Dir, env, bin, args...)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	s.etcd = p
	s.mu.Unlock()
	err = p.waitReady(ctx, s.opts.ReadyTimeout, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, clientURL+"/health", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/health: HTTP %d", resp.StatusCode)
		}
		return nil
	})
	if err != nil {
		s.stopEtcd()
		return "", err
	}
	return clientURL, nil
}

var etcdFlags = struct {
	sync.Once
	noFsync bool
}{}

// etcdHasNoFsync reports whether this etcd knows --unsafe-no-fsync (3.5+).
func etcdHasNoFsync(bin string) bool {
	etcdFlags.Do(func() {
		out, _ := exec.Command(bin, "--help").CombinedOutput()
		etcdFlags.noFsync = strings.Contains(string(out), "--unsafe-no-fsync")
	})
	return etcdFlags.noFsync
}

// configureKube writes the kubeconfig and builds the clients from it, so
// the file Reaper's binaries read is the one the tests exercise.
func (s *Stack) configureKube(host string, secrets *kubeSecrets) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["reaper"] = &clientcmdapi.Cluster{Server: host, CertificateAuthorityData: secrets.caPEM}
	cfg.AuthInfos["reaper-admin"] = &clientcmdapi.AuthInfo{Token: secrets.token}
	cfg.Contexts["reaper"] = &clientcmdapi.Context{Cluster: "reaper", AuthInfo: "reaper-admin", Namespace: "default"}
	cfg.CurrentContext = "reaper"
	path := filepath.Join(s.Dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return err
	}
	// Client-side throttling (default 5 QPS) only slows tests down.
	rc.QPS, rc.Burst = 1000, 2000
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	s.KubeconfigPath, s.restConfig, s.Kube = path, rc, kube
	s.reaperToken = secrets.reaperToken
	return nil
}

// RESTConfig returns a copy of the client configuration for the apiserver.
func (s *Stack) RESTConfig() *rest.Config {
	return rest.CopyConfig(s.restConfig)
}

// ReaperRESTConfig returns a client configuration for the apiserver as the
// user "reaper" in the group "reaper", which deploy/rbac.yaml binds. The
// user may do nothing until that is applied.
func (s *Stack) ReaperRESTConfig() *rest.Config {
	c := rest.AnonymousClientConfig(s.restConfig)
	c.BearerToken = s.reaperToken
	return c
}

// ReaperKubeconfig writes a kubeconfig for ReaperRESTConfig's user (the
// group "reaper", which the chart binds) and returns its path, for
// functions that must run as Reaper's own identity, under the chart's
// RBAC and admission policy.
func (s *Stack) ReaperKubeconfig() (string, error) {
	cfg, err := clientcmd.LoadFromFile(s.KubeconfigPath)
	if err != nil {
		return "", err
	}
	cfg.AuthInfos["reaper-admin"] = &clientcmdapi.AuthInfo{Token: s.reaperToken}
	path := filepath.Join(s.Dir, "kubeconfig-reaper")
	return path, clientcmd.WriteToFile(*cfg, path)
}

// StopAPIServer kills the apiserver (etcd keeps running) to simulate a
// Kubernetes API outage. Requests fail with "connection refused" until
// StartAPIServer.
func (s *Stack) StopAPIServer() {
	s.mu.Lock()
	p := s.apiserver
	s.apiserver = nil
	s.mu.Unlock()
	p.stop()
}

// StartAPIServer (re)starts the apiserver on the same port with the same
// etcd, certificates and tokens, so KubeconfigPath, RESTConfig and Kube stay
// valid, and waits until /readyz answers ok. It is a no-op while running.
func (s *Stack) StartAPIServer(ctx context.Context) error {
	s.mu.Lock()
	if s.apiserver != nil && !s.apiserver.exited() {
		s.mu.Unlock()
		return nil
	}
	if s.apiserverBin == "" || s.stopped {
		s.mu.Unlock()
		return errors.New("labstack: the stack has no Kubernetes part running")
	}
	p, err := launch("kube-apiserver", s.Dir, os.Environ(), s.apiserverBin, s.apiserverArgs...)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	s.apiserver = p
	s.mu.Unlock()

	rc := s.Kube.Discovery().RESTClient()
	err = p.waitReady(ctx, s.opts.ReadyTimeout, func(ctx context.Context) error {
		body, err := rc.Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return err
		}
		if string(body) != "ok" {
			return fmt.Errorf("/readyz: %s", body)
		}
		return nil
	})
	if err != nil {
		s.StopAPIServer()
		return err
	}
	return nil
}

// EnsureNamespaces creates the namespaces that do not exist yet. Even
// "default" may be missing on a fresh etcd right after the apiserver is
// ready.
func (s *Stack) EnsureNamespaces(ctx context.Context, names ...string) error {
	for _, name := range names {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		_, err := s.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create namespace %s: %w", name, err)
		}
	}
	return nil
}

// Env is the environment a Lambda bootstrap or a CLI child process needs to
// reach the stack: AWS endpoints, region and dummy credentials, and
// KUBECONFIG with the cluster's name (REAPER_CLUSTER). Append REAPER_TABLE
// and friends yourself.
func (s *Stack) Env() []string {
	env := []string{
		"AWS_REGION=" + Region,
		"AWS_DEFAULT_REGION=" + Region,
		"AWS_ACCESS_KEY_ID=" + AccessKeyID,
		"AWS_SECRET_ACCESS_KEY=" + SecretAccessKey,
		"AWS_EC2_METADATA_DISABLED=true",
	}
	if s.DynamoEndpoint != "" {
		env = append(env, "AWS_ENDPOINT_URL_DYNAMODB="+s.DynamoEndpoint)
	}
	if s.EC2 != nil {
		env = append(env, "AWS_ENDPOINT_URL_EC2="+s.EC2.URL())
	}
	if s.SQS != nil {
		env = append(env, "AWS_ENDPOINT_URL_SQS="+s.SQS.URL())
	}
	if s.KubeconfigPath != "" {
		env = append(env, "KUBECONFIG="+s.KubeconfigPath, "REAPER_CLUSTER="+Cluster)
	}
	return env
}

// AWSConfig returns an SDK configuration with the stack's region and static
// credentials whose service clients reach dynalite and the EC2 server, with
// no shared config files, environment or instance metadata involved:
//
//	ec2.NewFromConfig(stack.AWSConfig(ctx))
//
// The endpoints resolve like AWS_ENDPOINT_URL_<SERVICE> would, without
// touching the process environment.
func (s *Stack) AWSConfig(ctx context.Context) aws.Config {
	endpoints := endpointSource{}
	if s.DynamoEndpoint != "" {
		endpoints["DynamoDB"] = s.DynamoEndpoint
	}
	if s.EC2 != nil {
		endpoints["EC2"] = s.EC2.URL()
	}
	if s.SQS != nil {
		endpoints["SQS"] = s.SQS.URL()
	}
	return aws.Config{
		Region:        Region,
		Credentials:   credentials.NewStaticCredentialsProvider(AccessKeyID, SecretAccessKey, ""),
		ConfigSources: []any{endpoints},
		// See sqsserver.BufferedBodies: without it a response that
		// arrives while net/http still reads the request body costs a
		// retry, which SQS's receives and sends must not pay.
		HTTPClient: &http.Client{Transport: sqsserver.BufferedBodies{}},
	}
}

// endpointSource gives service clients their base endpoint by SDK service
// id, through the same hook the SDK uses for AWS_ENDPOINT_URL_<SERVICE>.
type endpointSource map[string]string

func (e endpointSource) GetServiceBaseEndpoint(_ context.Context, sdkID string) (string, bool, error) {
	v, ok := e[sdkID]
	return v, ok, nil
}

// Stop kills every process, closes the EC2 and SQS servers and removes Dir (unless
// Options.KeepDir). It is idempotent, so it can go straight to t.Cleanup.
func (s *Stack) Stop() {
	s.mu.Lock()
	s.stopped = true
	kcm, api, dyn := s.controllerManager, s.apiserver, s.dynalite
	s.controllerManager, s.apiserver, s.dynalite = nil, nil, nil
	s.mu.Unlock()

	kcm.stop()
	api.stop()
	dyn.stop()
	s.stopEtcd()
	if s.EC2 != nil {
		s.EC2.Close()
	}
	if s.SQS != nil {
		s.SQS.Close()
	}
	if !s.opts.KeepDir {
		os.RemoveAll(s.Dir)
	}
}

func (s *Stack) stopEtcd() {
	s.mu.Lock()
	p := s.etcd
	s.etcd = nil
	s.mu.Unlock()
	p.stop()
}

// logs lists the log file of each process started so far.
func (s *Stack) logs() []string {
	matches, _ := filepath.Glob(filepath.Join(s.Dir, "*.log"))
	return matches
}

func filterEnv(env []string, prefix string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, prefix) {
			out = append(out, kv)
		}
	}
	return out
}

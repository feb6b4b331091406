package labstack_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/labstack"
)

func TestStack(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	start := time.Now()
	stack := labstack.MustStart(t, labstack.Options{Namespaces: []string{"reaper-test"}})
	t.Logf("stack started in %v", time.Since(start).Round(time.Millisecond))

	// A Pod bound to a node that does not exist: no scheduler or kubelet
	// runs, the apiserver only stores it.
	pods := stack.Kube.CoreV1().Pods("default")
	pod, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "train-0"},
		Spec: corev1.PodSpec{
			NodeName:      "virtual-node-1",
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "main", Image: "busybox"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": pod.UID},
		"status": map[string]any{
			"phase": "Running",
			"containerStatuses": []map[string]any{{
				"name": "main", "image": "busybox", "imageID": "", "containerID": "containerd://abc",
				"ready": true, "restartCount": 0,
				"state": map[string]any{"running": map[string]any{"startedAt": "2026-01-01T00:00:00Z"}},
			}},
		},
	})
	if _, err := pods.Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("patch status: %v", err)
	}
	assertRunning(t, stack.Kube, pod.Name)

	// A patch carrying another UID is refused, which is what keeps a late
	// event from touching a recreated Pod of the same name.
	wrongUID := strings.Replace(string(patch), string(pod.UID), "00000000-0000-0000-0000-000000000000", 1)
	_, err = pods.Patch(ctx, pod.Name, types.StrategicMergePatchType, []byte(wrongUID), metav1.PatchOptions{}, "status")
	if !apierrors.IsInvalid(err) && !apierrors.IsConflict(err) {
		t.Errorf("patch with a wrong UID: want Invalid or Conflict, got %v", err)
	} else {
		t.Logf("patch with a wrong UID: %v (HTTP %d)", apierrors.ReasonForError(err), err.(apierrors.APIStatus).Status().Code)
	}

	if _, err := stack.Kube.CoreV1().Namespaces().Get(ctx, "reaper-test", metav1.GetOptions{}); err != nil {
		t.Errorf("namespace from Options: %v", err)
	}

	// AWS clients from AWSConfig reach dynalite and the EC2 server without
	// any per-client endpoint option.
	cfg := stack.AWSConfig(ctx)
	ddb := dynamodb.NewFromConfig(cfg)
	if _, err := ddb.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String("ledger"),
		AttributeDefinitions: []ddbtypes.AttributeDefinition{{AttributeName: aws.String("pk"), AttributeType: ddbtypes.ScalarAttributeTypeS}},
		KeySchema:            []ddbtypes.KeySchemaElement{{AttributeName: aws.String("pk"), KeyType: ddbtypes.KeyTypeHash}},
		BillingMode:          ddbtypes.BillingModePayPerRequest,
	}); err != nil {
		t.Fatalf("CreateTable: %v", err)
	}
	tables, err := ddb.ListTables(ctx, &dynamodb.ListTablesInput{})
	if err != nil || !slices.Equal(tables.TableNames, []string{"ledger"}) {
		t.Fatalf("ListTables = %v, %v", tables, err)
	}

	inst := stack.EC2.AddInstance(ec2server.Instance{Tags: map[string]string{"reaper.io/managed": "true"}})
	desc, err := ec2.NewFromConfig(cfg).DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{inst.ID}})
	if err != nil || len(desc.Reservations) != 1 {
		t.Fatalf("DescribeInstances = %v, %v", desc, err)
	}

	env := strings.Join(stack.Env(), "\n")
	for _, want := range []string{
		"AWS_ENDPOINT_URL_DYNAMODB=" + stack.DynamoEndpoint,
		"AWS_ENDPOINT_URL_EC2=" + stack.EC2.URL(),
		"AWS_REGION=us-east-1",
		"AWS_EC2_METADATA_DISABLED=true",
		"KUBECONFIG=" + stack.KubeconfigPath,
	} {
		if !strings.Contains(env, want) {
			t.Errorf("Env() lacks %s", want)
		}
	}

	// Outage and recovery: the same clients work again afterwards.
	stack.StopAPIServer()
	if _, err := pods.Get(ctx, pod.Name, metav1.GetOptions{}); err == nil {
		t.Fatal("Get succeeded with the apiserver stopped")
	}
	restart := time.Now()
	if err := stack.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("apiserver restarted in %v", time.Since(restart).Round(time.Millisecond))
	assertRunning(t, stack.Kube, pod.Name)

	// Stop leaves no process behind.
	pids := stackPIDs(t, stack)
	stack.Stop()
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d still exists after Stop (%v)", pid, err)
		}
	}
	if _, err := os.Stat(stack.Dir); !os.IsNotExist(err) {
		t.Errorf("Dir %s remains after Stop", stack.Dir)
	}
}

func assertRunning(t *testing.T, kube kubernetes.Interface, name string) {
	t.Helper()
	got, err := kube.CoreV1().Pods("default").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.PodRunning || len(got.Status.ContainerStatuses) != 1 ||
		got.Status.ContainerStatuses[0].State.Running == nil {
		t.Fatalf("pod status = %+v", got.Status)
	}
}

// stackPIDs lists the processes running in the stack's Dir: its children.
func stackPIDs(t *testing.T, stack *labstack.Stack) []int {
	t.Helper()
	entries, _ := filepath.Glob("/proc/[0-9]*/cwd")
	var pids []int
	for _, e := range entries {
		if cwd, err := os.Readlink(e); err == nil && cwd == stack.Dir {
			if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(e))); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	if runtime.GOOS == "linux" && len(pids) != 3 {
		t.Errorf("want 3 processes (etcd, kube-apiserver, dynalite) in %s, found %v", stack.Dir, pids)
	}
	return pids
}

func TestOnlyDynamo(t *testing.T) {
	t.Parallel()
	stack := labstack.MustStart(t, labstack.Options{Parts: labstack.Dynamo})
	if stack.Kube != nil || stack.KubeconfigPath != "" || stack.EC2 != nil || stack.DynamoEndpoint == "" {
		t.Fatalf("want only dynalite, got %+v", stack)
	}
	for _, kv := range stack.Env() {
		if strings.HasPrefix(kv, "KUBECONFIG=") || strings.HasPrefix(kv, "AWS_ENDPOINT_URL_EC2=") {
			t.Errorf("Env() has %s without that part", kv)
		}
	}
	if _, err := dynamodb.NewFromConfig(stack.AWSConfig(t.Context())).ListTables(t.Context(), &dynamodb.ListTablesInput{}); err != nil {
		t.Fatal(err)
	}
}

// Not parallel: it changes the environment.
func TestMissingBinaryNamesSetup(t *testing.T) {
	t.Setenv("REAPER_KUBE_APISERVER", "")
	t.Setenv("REAPER_RIE", "/nonexistent/aws-lambda-rie")
	_, err := labstack.Start(t.Context(), labstack.Options{})
	if err == nil || !strings.Contains(err.Error(), "REAPER_KUBE_APISERVER is not set") ||
		!strings.Contains(err.Error(), `eval "$(hack/setup.sh)"`) {
		t.Errorf("Start error = %v", err)
	}
	t.Setenv("REAPER_KUBE_CONTROLLER_MANAGER", "/nonexistent/kube-controller-manager")
	_, err = labstack.Start(t.Context(), labstack.Options{Parts: labstack.Kube, Controllers: []string{"job-controller"}})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/kube-controller-manager") ||
		!strings.Contains(err.Error(), `eval "$(hack/setup.sh)"`) {
		t.Errorf("Start with Controllers: error = %v", err)
	}
	// An alias would only time out on readiness: refused up front.
	if _, err = labstack.Start(t.Context(), labstack.Options{Parts: labstack.Kube, Controllers: []string{"job"}}); err == nil ||
		!strings.Contains(err.Error(), `"job" is not a canonical controller name`) {
		t.Errorf("Start with an alias: error = %v", err)
	}
	_, err = labstack.StartFunction(t.Context(), os.Args[0], nil)
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/aws-lambda-rie") ||
		!strings.Contains(err.Error(), `eval "$(hack/setup.sh)"`) {
		t.Errorf("StartFunction error = %v", err)
	}
}

func TestFunction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	bootstrap := buildHello(t)
	fn := labstack.MustStartFunction(t, bootstrap, []string{"HELLO_ENV=from-test"})

	resp, fnErr, err := fn.Invoke(ctx, []byte(`{"name":"reaper"}`))
	if err != nil || fnErr != nil {
		t.Fatalf("Invoke: %v %v", fnErr, err)
	}
	var got struct{ Greeting, Function, Env string }
	if err := json.Unmarshal(resp, &got); err != nil {
		t.Fatalf("response %s: %v", resp, err)
	}
	if got.Greeting != "hello reaper" || got.Function != "hello" || got.Env != "from-test" {
		t.Errorf("response = %+v", got)
	}

	resp, fnErr, err = fn.Invoke(ctx, []byte(`{"name":"reaper","fail":true}`))
	if err != nil {
		t.Fatal(err)
	}
	if fnErr == nil || fnErr.Message != "asked to fail" || fnErr.Type == "" {
		t.Fatalf("want a FunctionError, got %v (body %s)", fnErr, resp)
	}
	t.Logf("function error: %v", fnErr)

	// A panic kills the bootstrap: a function error, then a new cold start.
	_, fnErr, err = fn.Invoke(ctx, []byte(`{"panic":true}`))
	if err != nil || fnErr == nil || fnErr.Message != "asked to panic" {
		t.Fatalf("panic: want a FunctionError, got %v, %v", fnErr, err)
	}
	if _, fnErr, err = fn.Invoke(ctx, []byte(`{"name":"again"}`)); err != nil || fnErr != nil {
		t.Fatalf("after a crash: %v %v", fnErr, err)
	}
	if inits := fn.InitDurations(); len(inits) != 2 || inits[0] <= 0 {
		t.Errorf("InitDurations = %v, want two cold starts", inits)
	} else {
		t.Logf("cold starts: %v", inits)
	}

	logs := fn.Logs()
	if strings.Count(logs, `"msg":"hello invoked"`) != 4 || !strings.Contains(logs, "REPORT RequestId") {
		t.Errorf("logs:\n%s", logs)
	}
	fn.Stop()
	if !strings.Contains(fn.Logs(), "hello invoked") {
		t.Error("Logs() lost after Stop")
	}
}

// buildHello compiles testdata/hello the way `make build` builds the real
// functions, for the host architecture.
func buildHello(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "hello", "bootstrap")
	cmd := exec.Command("go", "build", "-tags", "lambda.norpc", "-o", out, "./testdata/hello")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+runtime.GOOS, "GOARCH="+runtime.GOARCH)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build testdata/hello: %v\n%s", err, b)
	}
	return out
}

package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/internal/doctorlab"
	"github.com/reaper-k8s/reaper/internal/labstack"
)

// TestDoctorCLI runs the built `reaper doctor` as an operator would, with
// nothing but the environment pointing it at a deployment on the local
// stack: the SDK's AWS_ENDPOINT_URL_<SERVICE> for the five AWS services,
// KUBECONFIG, and REAPER_CLUSTER naming the stack. Healthy, it lists every
// check as passed and exits 0; before the provider's Node exists it warns
// and still exits 0; with a message in the dead-letter queue it
// prints the failure with its fix and exits 1.
func TestDoctorCLI(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "reaper")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	lab := doctorlab.Start(t)
	env := append(lab.Env(), "HOME="+t.TempDir(), "PATH="+os.Getenv("PATH"))
	doctor := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"doctor"}, args...)...)
		cmd.Env = env
		var o, e strings.Builder
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit):
			code = exit.ExitCode()
		case err != nil:
			t.Fatal(err)
		}
		return o.String(), e.String(), code
	}

	out, errOut, code := doctor()
	if code != 0 || !strings.HasPrefix(out, "PASS  stack "+doctorlab.StackName+": CREATE_COMPLETE") ||
		!strings.HasSuffix(out, "\n14 checks: 0 failed, 0 warnings, 14 passed, 0 skipped\n") || errOut != "" {
		t.Errorf("healthy: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}

	// As deploy.md runs it before the provider is pointed at the stack:
	// no provider Node yet is a warning, not a failure.
	nodes := lab.Stack.Kube.CoreV1().Nodes()
	node, err := nodes.Get(t.Context(), doctorlab.ProviderNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := nodes.Delete(t.Context(), node.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = doctor("-cluster", labstack.Cluster, "-provider-nodes", "type=virtual-kubelet")
	if code != 0 || !strings.Contains(out, "WARN  admission policy reaper-pod-status: no provider Node yet: no Node matches -provider-nodes \"type=virtual-kubelet\"") ||
		!strings.Contains(out, "      fix: start the provider") || !strings.HasSuffix(out, "\n14 checks: 0 failed, 1 warnings, 13 passed, 0 skipped\n") || errOut != "" {
		t.Errorf("before the provider runs: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	node.ResourceVersion = ""
	if _, err := nodes.Create(t.Context(), node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code = doctor("-provider-nodes", "type in (virtual-kubelet"); code != 1 || !strings.Contains(errOut, "-provider-nodes \"type in (virtual-kubelet\": want a label selector") {
		t.Errorf("a selector that does not parse: exit %d, stderr %q", code, errOut)
	}

	url := lab.Outputs["DeadLetterQueueUrl"]
	if _, err := sqs.NewFromConfig(lab.AWSConfig(t.Context())).SendMessage(t.Context(), &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String("work")}); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = doctor("-stack", doctorlab.StackName)
	t.Logf("with a message in the dead-letter queue:\n%s%s", out, errOut)
	if code != 1 || !strings.Contains(out, "FAIL  dead-letter queue: 1 message in "+url+"\n      fix: ") ||
		!strings.Contains(out, "aws sqs start-message-move-task") || errOut != "reaper doctor: 1 check failed\n" {
		t.Errorf("a message in the dead-letter queue: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}

	env = append(env, "REAPER_CLUSTER=")
	if _, errOut, code = doctor(); code != 1 || !strings.Contains(errOut, "-cluster") {
		t.Errorf("no cluster or stack named: exit %d, stderr %q", code, errOut)
	}
}

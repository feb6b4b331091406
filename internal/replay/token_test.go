package replay

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// The tests of this file are the exit token's rows of the fault matrix,
// through the built functions. They sweep, so like those of
// hostile_test.go none runs in parallel.

// tokenLine is the exit line of pod on instance id, carrying the exit
// token.
func tokenLine(t *testing.T, id string, pod *corev1.Pod, code int, restart int32, token string) string {
	t.Helper()
	var l exitline.Line
	if err := json.Unmarshal([]byte(line(t, id, pod, code, restart)), &l); err != nil {
		t.Fatal(err)
	}
	l.Token = token
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// hostToken is the exit token of the hosts of the token tests.
const hostToken = "a-token-only-the-instances-own-host-knows-0123456789"

// The token holds after EC2 forgets the instance: the sweep adopts the
// running instance launched with the exit-token tag, and its record keeps
// the tag's hash; once EC2 no longer lists the instance, a line naming the
// record's Pod without the token is refused (token-mismatch) and writes
// nothing, and the line with the token ends the Pod.
func TestExitTokenAfterEC2Forgot(t *testing.T) {
	ctx := t.Context()
	pod, err := lab.RunningPod(ctx, "hostile", "token-forgotten", corev1.RestartPolicyNever)
	if err != nil {
		t.Fatal(err)
	}
	id := hostileInstance(0xf11, 1)
	tags := lab.InstanceTags(pod, true, labstack.Cluster)
	tags[model.DefaultTagExitToken] = model.ExitTokenHash(hostToken)
	lab.AddTaggedInstance(id, tags)
	if sum := sweepNow(t); sum.Adopted < 1 {
		t.Fatalf("sweep %+v: the running instance not adopted", sum)
	}
	if rec := record(t, id); rec.Pod.UID != string(pod.UID) || rec.ExitTokenHash != model.ExitTokenHash(hostToken) {
		t.Fatalf("adopted record %+v, want the Pod and the exit-token hash of the tags", rec)
	}
	lab.Stack.EC2.RemoveInstance(id)
	wantRejected(t, exitPayload(t, id, line(t, id, pod, 3, 0)), map[string]int{model.ReasonTokenMismatch: 1})
	wantUntouched(t, pod)
	invokeExit(t, exitPayload(t, id, tokenLine(t, id, pod, 0, 0, hostToken)))
	wantEnded(t, getPod(t, "hostile", "token-forgotten"), corev1.PodSucceeded, 0, "Completed")
}

// A provider that tags the token's hash under another key than the
// deployment reads (REAPER_TAG_EXIT_TOKEN) gets no token check: the line
// with a token is believed, as for an instance launched without one, and
// counted (ExitTokensUnexpected) and logged once, so that the mismatch
// does not go unnoticed.
func TestExitTokenUnderAnotherKey(t *testing.T) {
	ctx := t.Context()
	pod, err := lab.RunningPod(ctx, "hostile", "token-other-key", corev1.RestartPolicyNever)
	if err != nil {
		t.Fatal(err)
	}
	id := hostileInstance(0xf12, 1)
	tags := lab.InstanceTags(pod, true, labstack.Cluster)
	tags["example.com/exit-token-sha256"] = model.ExitTokenHash(hostToken)
	lab.AddTaggedInstance(id, tags)
	unexpected := func() (counted, logged int) {
		for _, f := range lab.Reconcilers {
			logs := f.Logs()
			_, values, _ := metric(emfLines(t, logs), metrics.FunctionReconciler, metrics.ExitTokensUnexpected, nil)
			for _, v := range values {
				counted += int(v)
			}
			for l := range strings.Lines(logs) {
				if strings.Contains(l, `"msg":"exit token without an exit-token tag"`) && strings.Contains(l, `"instance":"`+id+`"`) {
					logged++
				}
			}
		}
		return counted, logged
	}
	counted, logged := unexpected()
	invokeExit(t, exitPayload(t, id, tokenLine(t, id, pod, 0, 0, hostToken)))
	wantEnded(t, getPod(t, "hostile", "token-other-key"), corev1.PodSucceeded, 0, "Completed")
	if c, l := unexpected(); c-counted != 1 || l-logged != 1 {
		t.Fatalf("%s counted %d, logged %d times, want 1 each", metrics.ExitTokensUnexpected, c-counted, l-logged)
	}
}

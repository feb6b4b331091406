package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/reaper"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// A dry run decides as the real run does and changes nothing. Each
// scenario is seeded for real; then its last batch goes to a dry-run core
// and, after it, to a real one, both wired by reaperapp.New from the same
// setup but REAPER_DRY_RUN, against the real apiserver, dynalite and the
// EC2 test server. The dry run must leave the ledger record, the Pod and
// the instance as they were, and its decisions (the records its ledger
// writes answer, the Pod writes, the terminations) must be the real run's.
func TestDryRunDecidesAsTheRealRun(t *testing.T) {
	ctx := t.Context()
	const ns, table = "dry-run", "dry-run"
	var clock atomic.Int64
	start := time.Now().Truncate(time.Second)
	clock.Store(start.UnixNano())
	wire := func(dry bool, d *decisions) *reaper.Reaper {
		_, core := newPropCore(t, propCore{table: table, ec2: lab.Stack.EC2, cluster: labstack.Cluster, clock: &clock,
			queue: &memQueue{}, dryRun: dry})
		core.Ledger, core.Pods, core.Fleet = recordingLedger{core.Ledger, d}, recordingPods{core.Pods, d}, recordingFleet{core.Fleet, d}
		return core
	}
	seedCore := wire(false, &decisions{})
	db := dynamodb.NewFromConfig(lab.Stack.AWSConfig(ctx))
	records := ledger.New(db, table)

	for n, tc := range []struct {
		name string
		// world sets up the instance and the Pod beyond a running pair.
		world       func(id string, pod *corev1.Pod)
		seed, final func(id string, pod model.PodRef) []workqueue.Message
		// after is how long after the seed the final batch comes.
		after time.Duration
		want  []string
		// same: the real run, too, leaves the world as it was.
		same bool
	}{
		{name: "exit", final: func(id string, pod model.PodRef) []workqueue.Message {
			return []workqueue.Message{workqueue.Exit(id, pod, model.Exit{Container: "main", FinishedAt: start})}
		}, want: []string{"ledger exit/0", "pod exit/0 write", "terminate"}},
		// The dry run once said would-terminate here, from a hand copy of
		// the ledger's rules that ignored the order of events. The stale
		// event is known for one from the record the batch read: no write,
		// no terminate.
		{name: "stale stop after running", seed: func(id string, _ model.PodRef) []workqueue.Message {
			return []workqueue.Message{workqueue.State(id, model.StateRunning, start.Add(2*time.Second))}
		}, final: func(id string, _ model.PodRef) []workqueue.Message {
			return []workqueue.Message{workqueue.State(id, model.StateStopped, start.Add(time.Second))}
		}, want: nil, same: true},
		{name: "stopped", world: func(id string, _ *corev1.Pod) { lab.Stack.EC2.SetState(id, ec2server.Stopped) },
			final: func(id string, _ model.PodRef) []workqueue.Message {
				return []workqueue.Message{workqueue.State(id, model.StateStopped, start)}
			}, want: []string{"ledger state stopped gone", "terminate"}},
		{name: "lost after the window",
			seed: func(id string, _ model.PodRef) []workqueue.Message {
				// EC2 sends the event once the instance is terminated.
				lab.Stack.EC2.SetState(id, ec2server.Terminated)
				return []workqueue.Message{workqueue.State(id, model.StateTerminated, start)}
			}, final: func(id string, _ model.PodRef) []workqueue.Message { return []workqueue.Message{workqueue.Sweep(id)} },
			after: propWindow + time.Second, want: []string{"pod lost write"}},
		{name: "claim for another Pod", final: func(id string, pod model.PodRef) []workqueue.Message {
			pod.UID = "00000000-0000-0000-0000-0000000f0123"
			return []workqueue.Message{workqueue.Exit(id, pod, model.Exit{Container: "main", FinishedAt: start})}
		}, same: true},
		{name: "orphan", world: func(_ string, pod *corev1.Pod) {
			// No kubelet confirms a graceful deletion on the virtual node.
			if err := lab.Stack.Kube.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
				t.Fatal(err)
			}
		}, final: func(id string, _ model.PodRef) []workqueue.Message {
			return []workqueue.Message{workqueue.Orphan(id, 1)}
		},
			want: []string{"terminate"}},
		{name: "exit again", seed: func(id string, pod model.PodRef) []workqueue.Message {
			return []workqueue.Message{workqueue.Exit(id, pod, model.Exit{Container: "main", FinishedAt: start})}
		}, final: func(id string, pod model.PodRef) []workqueue.Message {
			return []workqueue.Message{workqueue.Exit(id, pod, model.Exit{Container: "main", FinishedAt: start})}
			// The first terminal exit is final: the same line again
			// writes nothing.
		}, same: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock.Store(start.UnixNano())
			id := fmt.Sprintf("i-%017x", 0x0d1700000000000+n)
			pod, err := lab.RunningPod(ctx, ns, fmt.Sprintf("dry-%d", n), corev1.RestartPolicyNever)
			if err != nil {
				t.Fatal(err)
			}
			lab.AddInstance(id, pod, true)
			ref := model.PodRef{Namespace: ns, Name: pod.Name, UID: string(pod.UID)}
			if tc.seed != nil {
				handleBatch(t, seedCore, tc.seed(id, ref))
			}
			if tc.world != nil {
				tc.world(id, pod)
			}
			clock.Add(int64(tc.after))
			snapshot := func() string { return worldState(t, records, id, pod) }
			before := snapshot()

			var dry, real decisions
			handleBatch(t, wire(true, &dry), tc.final(id, ref))
			if after := snapshot(); after != before {
				t.Fatalf("the dry run changed the world:\nbefore %s\nafter  %s", before, after)
			}
			handleBatch(t, wire(false, &real), tc.final(id, ref))
			if !slices.Equal(dry.list(), real.list()) {
				t.Fatalf("the dry run decided %q, the real run %q", dry.list(), real.list())
			}
			if !slices.Equal(real.list(), tc.want) {
				t.Fatalf("decided %q, want %q", real.list(), tc.want)
			}
			if after := snapshot(); (after == before) != tc.same {
				t.Fatalf("the real run left the world the same: %v, want %v\nbefore %s\nafter  %s", after == before, tc.same, before, after)
			}
		})
	}
}

func handleBatch(t *testing.T, core *reaper.Reaper, msgs []workqueue.Message) {
	t.Helper()
	q := &memQueue{}
	if _, err := q.Send(t.Context(), 0, msgs...); err != nil {
		t.Fatal(err)
	}
	q.drain(t, core)
}

// worldState is what a run can change: the instance's ledger record, its
// Pod and its state in EC2.
func worldState(t *testing.T, records *ledger.Table, id string, pod *corev1.Pod) string {
	t.Helper()
	ctx := t.Context()
	rec, _, err := records.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	podState := "gone"
	switch p, err := lab.Stack.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); {
	case apierrors.IsNotFound(err):
	case err != nil:
		t.Fatal(err)
	default:
		podState = fmt.Sprintf("%s rv=%s", p.Status.Phase, p.ResourceVersion)
	}
	inst, _ := lab.Stack.EC2.Instance(id)
	return fmt.Sprintf("record %s; pod %s; instance %s", b, podState, inst.State)
}

// decisions are what a core decided, in a form the dry and the real run
// share: a Pod write is "write" whether it was made or only decided, a
// termination "terminate" likewise.
type decisions struct {
	mu   sync.Mutex
	made []string
}

func (d *decisions) add(s string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.made = append(d.made, s)
}

func (d *decisions) list() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.made)
}

type recordingLedger struct {
	reaper.Ledger
	d *decisions
}

func (l recordingLedger) RecordExit(ctx context.Context, id string, pod model.PodRef, exitTokenHash string, exit model.Exit) (ledger.Record, error) {
	rec, err := l.Ledger.RecordExit(ctx, id, pod, exitTokenHash, exit)
	if err == nil {
		l.d.add(fmt.Sprintf("ledger exit/%d", rec.Latest().RestartCount))
	}
	return rec, err
}

func (l recordingLedger) RecordState(ctx context.Context, id string, pod model.PodRef, exitTokenHash string, sc ledger.StateChange) (ledger.Record, error) {
	rec, err := l.Ledger.RecordState(ctx, id, pod, exitTokenHash, sc)
	if err == nil {
		s := "ledger state " + rec.LastState
		if rec.Gone != nil {
			s += " gone"
		}
		l.d.add(s)
	}
	return rec, err
}

type recordingPods struct {
	reaper.Pods
	d *decisions
}

func (p recordingPods) ApplyTo(ctx context.Context, snap kube.Snapshot, o model.Outcome) (kube.Applied, error) {
	applied, err := p.Pods.ApplyTo(ctx, snap, o)
	if err == nil {
		res := applied.Result
		r := string(res)
		if res == kube.Patched || res == kube.DryRun {
			r = "write"
		}
		p.d.add(strings.Join([]string{"pod", o.Key(), r}, " "))
	}
	return applied, err
}

type recordingFleet struct {
	reaper.Fleet
	d *decisions
}

func (f recordingFleet) Terminate(ctx context.Context, ids []string, known map[string]instances.Instance) instances.Terminated {
	out := f.Fleet.Terminate(ctx, ids, known)
	for _, id := range ids {
		switch out.Outcome[id] {
		case instances.Terminating, instances.WouldTerminate:
			f.d.add("terminate")
		case "":
		default:
			f.d.add("terminate " + string(out.Outcome[id]))
		}
	}
	return out
}

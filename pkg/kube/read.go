package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// listPageSize is the number of Pods a LIST page asks for: the page size
// client-go's pager uses, which the apiserver serves without strain.
const listPageSize = 500

// seatsPerPage is what the apiserver's API Priority and Fairness charges a
// LIST page against Reaper's priority level, in the seats a GET takes: its
// list work estimator counts a paginated LIST as twice its limit in
// objects, one seat per 100 objects, at most 10 seats. A page costs as
// much as ten GETs, and the Pods it carries cost the reconciler's CPU to
// decode: a batch of 65 Pods in a namespace of 10,000 listed the whole
// namespace, 20 pages for 65 Pods.
const seatsPerPage = 10

// Parallel reads: namespaces read at once by ReadMany, and GETs in flight
// within one namespace (reads come before a batch's writes, which have
// 32 in flight).
const (
	namespaceWorkers = 4
	getWorkers       = 8
)

// ReadMany reads the Pods refs name, each snapshot meaning what Read's
// does, in about one request per 500 Pods of their namespaces: it LISTs
// each namespace in pages rather than GET each Pod, as long as that costs
// the apiserver less. A namespace never costs much more than a GET per Pod
// wanted from it, counted in API Priority and Fairness seats
// (seatsPerPage): up to seatsPerPage wanted Pods are read with GETs, and
// when the pages left to list would cost more seats than GETs of the Pods
// still wanted, those are read with GETs instead.
//
// A LIST is one consistent read: a Pod missing from a complete list is
// gone. A read that fails costs only the refs it concerns: they are absent
// from the map, and the error joins the failed reads' errors; the other
// snapshots are returned.
//
// A LIST the identity may not make (RBAC without "list" on pods) falls back
// to GETs, as does a LIST whose continue token expired.
func (w *StatusWriter) ReadMany(ctx context.Context, refs []model.PodRef) (map[model.PodRef]Snapshot, error) {
	byNamespace := map[string]map[string][]model.PodRef{}
	for _, ref := range refs {
		names := byNamespace[ref.Namespace]
		if names == nil {
			names = map[string][]model.PodRef{}
			byNamespace[ref.Namespace] = names
		}
		if !slices.Contains(names[ref.Name], ref) {
			names[ref.Name] = append(names[ref.Name], ref)
		}
	}
	out := &readResults{snaps: make(map[model.PodRef]Snapshot, len(refs))}
	namespaces := make(chan string)
	var wg sync.WaitGroup
	for range min(namespaceWorkers, len(byNamespace)) {
		wg.Go(func() {
			for ns := range namespaces {
				w.readNamespace(ctx, ns, byNamespace[ns], out)
			}
		})
	}
	for ns := range byNamespace {
		namespaces <- ns
	}
	close(namespaces)
	wg.Wait()
	return out.snaps, errors.Join(out.errs...)
}

// readResults gathers ReadMany's answers from its workers.
type readResults struct {
	mu    sync.Mutex
	snaps map[model.PodRef]Snapshot
	errs  []error
}

// found notes what a read that found pod (nil: no Pod of that name) says
// of each of refs.
func (r *readResults) found(refs []model.PodRef, pod *corev1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ref := range refs {
		r.snaps[ref] = snapshot(ref, pod)
	}
}

func (r *readResults) failed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

// readNamespace reads the Pods of one namespace that wanted names (each
// name's refs): in LIST pages while they cost fewer seats than GETs.
func (w *StatusWriter) readNamespace(ctx context.Context, ns string, wanted map[string][]model.PodRef, out *readResults) {
	if len(wanted) <= seatsPerPage {
		w.getEach(ctx, wanted, out)
		return
	}
	continueToken := ""
	for {
		var page corev1.PodList
		req := w.client.Get().Namespace(ns).Resource("pods").Param("limit", strconv.Itoa(listPageSize))
		if continueToken != "" {
			req = req.Param("continue", continueToken)
		}
		err := req.Do(ctx).Into(&page)
		if apierrors.IsForbidden(err) || apierrors.IsResourceExpired(err) {
			w.logger().LogAttrs(ctx, slog.LevelWarn, "pod list refused; reading by name", slog.String("namespace", ns),
				slog.Int("pods", len(wanted)), slog.String("error", err.Error()))
			w.getEach(ctx, wanted, out)
			return
		}
		if err != nil {
			out.failed(fmt.Errorf("list pods in %s (%d wanted): %w", ns, len(wanted), err))
			return
		}
		for i := range page.Items {
			pod := &page.Items[i]
			if refs, ok := wanted[pod.Name]; ok {
				out.found(refs, pod)
				delete(wanted, pod.Name)
			}
		}
		continueToken = page.Continue
		switch {
		case len(wanted) == 0:
			return
		case continueToken == "":
			// The list is complete: the Pods it did not hold are gone.
			for _, refs := range wanted {
				out.found(refs, nil)
			}
			return
		case page.RemainingItemCount != nil && seatsPerPage*pagesFor(*page.RemainingItemCount) >= int64(len(wanted)):
			w.getEach(ctx, wanted, out)
			return
		}
	}
}

// pagesFor is the number of LIST pages that hold n Pods.
func pagesFor(n int64) int64 { return (n + listPageSize - 1) / listPageSize }

// getEach reads each wanted name with a GET, getWorkers at a time.
func (w *StatusWriter) getEach(ctx context.Context, wanted map[string][]model.PodRef, out *readResults) {
	names := make(chan []model.PodRef)
	var wg sync.WaitGroup
	for range min(getWorkers, len(wanted)) {
		wg.Go(func() {
			for refs := range names {
				// Refs of one name differ only in UID: one read answers all.
				pod, err := w.getPod(ctx, refs[0])
				if err != nil {
					out.failed(err)
					continue
				}
				out.found(refs, pod)
			}
		})
	}
	for _, refs := range wanted {
		names <- refs
	}
	close(names)
	wg.Wait()
}

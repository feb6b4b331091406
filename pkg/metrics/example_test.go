package metrics_test

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/reaper-k8s/reaper/pkg/metrics"
)

func ExampleRecorder() {
	// Handlers log with slog.NewJSONHandler on stdout. This one drops the
	// clock fields so that the output below is the same on every run.
	log := slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 || a.Key == "Timestamp" && slices.Equal(groups, []string{"_aws"}) {
				return slog.Attr{}
			}
			return a
		},
	}))
	rec := metrics.New(log, metrics.DefaultNamespace, "sweeper")

	rec.Count("InstancesTerminated", 2)
	rec.Observe("SweepDuration", 1250*time.Millisecond)
	rec.By(metrics.Outcome("applied")).Count("PodPatches", 1)

	// Once per invocation, before it returns: Lambda does not flush on a
	// timeout.
	if err := rec.Flush(context.Background()); err != nil {
		log.Error("flush metrics", "err", err)
	}
	// Output:
	// {"level":"INFO","msg":"metrics","_aws":{"CloudWatchMetrics":[{"Namespace":"Reaper","Dimensions":[["Function"]],"Metrics":[{"Name":"InstancesTerminated","Unit":"Count"},{"Name":"SweepDuration","Unit":"Milliseconds"}]}]},"Function":"sweeper","InstancesTerminated":2,"SweepDuration":1250}
	// {"level":"INFO","msg":"metrics","_aws":{"CloudWatchMetrics":[{"Namespace":"Reaper","Dimensions":[["Function","Outcome"]],"Metrics":[{"Name":"PodPatches","Unit":"Count"}]}]},"Function":"sweeper","Outcome":"applied","PodPatches":1}
}

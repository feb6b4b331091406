// Command throughput extrapolates a burst to a deployment: how long
// 10,000 Pods ending within 10 s wait for their terminal status when the
// reconcilers write Pods at a given rate, under the event source mapping's
// batching. It is arithmetic, not a measurement: the measured inputs (the
// reconcilers' CPU per exit, the Kubernetes requests per Pod) come from
// BenchmarkBurstProviders, and bench/REPORT.md gives the table it prints.
//
// The model: exits delivered uniformly over -span, each 0.3 – 1.5 s after
// it was written (the subscription's lag); one poller hands a batch to a
// free reconciler (at most -concurrency at once) when its window has
// passed since its first message, with at most -batch messages; a batch
// spends -setup on its lookups and ledger writes, then writes its Pods one
// after the other at the reconciler's rate, the lesser of what its CPU
// allows (vCPU / CPU per exit) and what its Kubernetes client sends (QPS /
// requests per Pod).
//
//	go run ./bench/throughput
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// deployment is one row of the table: a reconciler's memory and its
// Kubernetes client's QPS.
type deployment struct {
	name     string
	memoryMB int
	qps      float64
}

func main() {
	exits := flag.Int("exits", 10000, "Pods ending in the burst")
	span := flag.Duration("span", 10*time.Second, "time over which the exits are written")
	concurrency := flag.Int("concurrency", 2, "reconcilers at once (the event source mapping's maximum concurrency)")
	batch := flag.Int("batch", 10000, "most messages a batch")
	window := flag.Duration("window", time.Second, "the batching window")
	setup := flag.Duration("setup", 1500*time.Millisecond, "a batch's time before its first Pod write")
	cpuPerExit := flag.Duration("cpu", 6300*time.Microsecond, "the reconciler's CPU per exit (BenchmarkBurstProviders)")
	requestsPerPod := flag.Float64("requests", 2.01, "Kubernetes requests per Pod written")
	flag.Parse()

	fmt.Printf("| reconciler memory, client QPS | Pods a second per reconciler: CPU / client | p50 after delivery | p99 | last Pod after the last delivery | batches |\n|---|---|---|---|---|---|\n")
	for _, d := range []deployment{
		{"256 MB, 200 QPS", 256, 200},
		{"1,769 MB, 200 QPS", 1769, 200},
		{"1,769 MB, 600 QPS", 1769, 600},
		{"3,538 MB, 600 QPS", 3538, 600},
	} {
		byCPU := float64(d.memoryMB) / 1769 / cpuPerExit.Seconds()
		byClient := d.qps / *requestsPerPod
		r := run(*exits, *span, *concurrency, *batch, *window, *setup, min(byCPU, byClient))
		fmt.Printf("| %s | %.0f / %.0f | %.1f s | %.1f s | %.1f s | %d |\n", d.name, byCPU, byClient,
			r.p50.Seconds(), r.p99.Seconds(), r.last.Seconds(), r.batches)
	}
}

type result struct {
	p50, p99, last time.Duration
	batches        int
}

// run plays the model once with each reconciler writing rate Pods a second.
func run(exits int, span time.Duration, concurrency, maxBatch int, window, setup time.Duration, rate float64) result {
	rng := rand.New(rand.NewPCG(21, 21))
	arrive := make([]float64, exits)
	for i := range arrive {
		arrive[i] = rng.Float64()*span.Seconds() + 0.3 + 1.2*rng.Float64()
	}
	slices.Sort(arrive)
	free := make([]float64, concurrency) // when each reconciler is next free
	var lat []float64
	var last float64
	batches := 0
	for i := 0; i < exits; {
		k := 0
		for j := range free {
			if free[j] < free[k] {
				k = j
			}
		}
		// The batch closes a window after its first message, or when its
		// reconciler frees up, whichever is later, or once full.
		closes := max(arrive[i]+window.Seconds(), free[k])
		j := i
		for j < exits && arrive[j] <= closes && j-i < maxBatch {
			j++
		}
		if j-i == maxBatch {
			closes = max(arrive[j-1], free[k])
		}
		batches++
		begin := closes + setup.Seconds()
		for m := i; m < j; m++ {
			written := begin + float64(m-i+1)/rate
			lat = append(lat, written-arrive[m])
			last = max(last, written)
		}
		free[k] = begin + float64(j-i)/rate
		i = j
	}
	slices.Sort(lat)
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	return result{p50: sec(lat[len(lat)/2]), p99: sec(lat[len(lat)*99/100]), last: sec(last - arrive[exits-1]), batches: batches}
}

package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/internal/labstack"
)

// clockTick is the unit of /proc CPU times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// cpuSample is the CPU time used so far by this process (the in-process
// functions' clients, the EC2 and SQS test servers, the DynamoDB counting
// proxy), by the stack's processes, and by the whole machine.
type cpuSample struct {
	by   map[string]time.Duration // "bench", "apiserver", "etcd", "dynalite"
	busy time.Duration            // every CPU of the machine, non-idle
}

func sampleCPU() cpuSample {
	s := cpuSample{by: map[string]time.Duration{}}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.by["bench"] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for _, pid := range labstack.ChildPIDs(os.Getpid()) {
		comm, cpu, ok := procCPU(pid)
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(comm, "kube-apiserver"): // comm is cut at 15 bytes
			s.by["apiserver"] += cpu
		case comm == "etcd":
			s.by["etcd"] += cpu
		case comm == "node":
			s.by["dynalite"] += cpu
		default:
			s.by[comm] += cpu
		}
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
		for i, v := range f[1:] {
			if i == 3 || i == 4 { // idle, iowait
				continue
			}
			if i > 7 { // guest time is already in user
				break
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			s.busy += time.Duration(n) * clockTick
		}
	}
	return s
}

// sub returns CPU used between two samples; "other" is what the rest of
// the machine used (other work sharing it).
func (s cpuSample) sub(before cpuSample) map[string]time.Duration {
	out := map[string]time.Duration{}
	var ours time.Duration
	for k, v := range s.by {
		out[k] = v - before.by[k]
		ours += out[k]
	}
	out["other"] = max(0, s.busy-before.busy-ours)
	return out
}

// procCPU reads a process's name and user+system CPU time.
func procCPU(pid int) (string, time.Duration, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, false
	}
	s := string(b)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return "", 0, false
	}
	comm := s[open+1 : closing]
	f := strings.Fields(s[closing+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return "", 0, false
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return comm, time.Duration(utime+stime) * clockTick, true
}

// procMemory reads a process's peak and current resident set size.
func procMemory(pid int) (hwm, rss int64, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, found := strings.Cut(line, ":")
		if !found {
			continue
		}
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmHWM":
			hwm = kb << 10
		case "VmRSS":
			rss = kb << 10
		}
	}
	return hwm, rss, hwm > 0
}

// pidOf finds the process running the executable at path.
func pidOf(path string) (int, bool) {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		if exe, err := os.Readlink(filepath.Join(d, "exe")); err == nil && exe == path {
			pid, err := strconv.Atoi(filepath.Base(d))
			return pid, err == nil
		}
	}
	return 0, false
}

// quietShare is how much of the machine other work may use while a timed
// pass starts; quietWait is how long to wait for that.
const (
	quietShare = 0.10
	quietWait  = 90 * time.Second
)

// waitQuiet waits, up to quietWait, until the rest of the machine (other
// than this process and the stack) has used less than quietShare of the
// CPUs for a second: the stack shares the machine with whatever else runs.
// It returns what each of our processes used per second of that quiet
// second (their background work: etcd heartbeats, apiserver bookkeeping).
func waitQuiet(b *testing.B) map[string]float64 {
	deadline := time.Now().Add(quietWait)
	for {
		before := sampleCPU()
		time.Sleep(time.Second)
		used := sampleCPU().sub(before)
		share := float64(used["other"]) / float64(time.Duration(runtime.NumCPU())*time.Second)
		if share < quietShare || time.Now().After(deadline) {
			if share >= quietShare {
				b.Logf("machine still busy (other work at %.0f%% of the CPUs); measuring anyway", share*100)
			}
			idle := map[string]float64{}
			for k, v := range used {
				if k != "other" {
					idle[k] = v.Seconds()
				}
			}
			return idle
		}
	}
}

// profileEnv names a directory: each timed pass then writes a CPU profile
// of this process there (the in-process functions and the test servers).
const profileEnv = "REAPER_BENCH_CPUPROFILE"

func startProfile(b *testing.B) (stop func()) {
	dir := os.Getenv(profileEnv)
	if dir == "" {
		return func() {}
	}
	name := strings.NewReplacer("/", "_", "=", "").Replace(b.Name())
	f, err := os.Create(filepath.Join(dir, name+".pprof"))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

package labstack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// cfsPeriod is the CPU controller's accounting period the quota is a part of.
const cfsPeriod = 100 * time.Millisecond

// LimitCPU gives the function (the emulator and the bootstrap it starts on
// the first invocation) at most vcpu CPUs, as Lambda gives a function a
// share of a CPU in proportion to its memory (LambdaVCPU): it makes a CPU
// cgroup of the function's own whose CFS quota is vcpu times its period
// and moves the emulator into it, where the bootstrap it forks stays. It
// needs a writable CPU controller, cgroup v2 (cpu.max) or v1
// (cpu.cfs_quota_us), as root has; Stop removes the cgroup. Call it before
// the first Invoke.
func (f *Function) LimitCPU(vcpu float64) error {
	if vcpu <= 0 {
		return fmt.Errorf("labstack: a CPU limit of %g CPUs", vcpu)
	}
	quota := strconv.FormatInt(int64(vcpu*float64(cfsPeriod/time.Microsecond)), 10)
	period := strconv.FormatInt(int64(cfsPeriod/time.Microsecond), 10)
	name := fmt.Sprintf("reaper-lab-%d", f.proc.cmd.Process.Pid)
	var dir string
	var limits [][2]string // file, value, in the order they are written
	switch {
	case exists("/sys/fs/cgroup/cgroup.controllers"): // v2, unified
		dir, limits = filepath.Join("/sys/fs/cgroup", name), [][2]string{{"cpu.max", quota + " " + period}}
	case exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"): // v1
		dir, limits = filepath.Join("/sys/fs/cgroup/cpu", name), [][2]string{{"cpu.cfs_period_us", period}, {"cpu.cfs_quota_us", quota}}
	default:
		return errors.New("labstack: no CPU cgroup controller at /sys/fs/cgroup to limit a function's CPU with")
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("labstack: limit the CPU of %s: %w (it needs root, or a delegated cgroup)", f.Name, err)
	}
	f.cgroup = dir
	for _, l := range limits {
		if err := os.WriteFile(filepath.Join(dir, l[0]), []byte(l[1]), 0o644); err != nil {
			return fmt.Errorf("labstack: limit the CPU of %s: %w", f.Name, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(f.proc.cmd.Process.Pid)), 0o644); err != nil {
		return fmt.Errorf("labstack: limit the CPU of %s: %w", f.Name, err)
	}
	return nil
}

// removeCgroup removes the function's CPU cgroup once its processes are
// gone (a killed process leaves it a moment later).
func (f *Function) removeCgroup() {
	if f.cgroup == "" {
		return
	}
	for range 50 {
		if err := os.Remove(f.cgroup); err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

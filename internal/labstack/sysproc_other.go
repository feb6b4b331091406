//go:build unix && !linux

package labstack

import "syscall"

// sysProcAttr puts each child in its own process group, so stop can kill
// whatever it forked. Only Linux can also tie the child's life to the test
// binary (Pdeathsig); elsewhere a killed test binary can leak children.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// ChildPIDs cannot list children portably. A Lambda bootstrap exits on its
// own once the emulator's runtime API goes away.
func ChildPIDs(int) []int { return nil }

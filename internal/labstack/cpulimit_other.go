//go:build unix && !linux

package labstack

import "errors"

// LimitCPU needs Linux's CPU cgroups.
func (f *Function) LimitCPU(float64) error {
	return errors.New("labstack: limiting a function's CPU needs Linux cgroups")
}

func (f *Function) removeCgroup() {}

//go:build deps

// With deps, hello links every package the functions link, without calling
// the wiring (app.Load, reaperapp.New): a function's init less this one's
// is the wiring's share (BenchmarkInitParts).

package main

import (
	_ "github.com/reaper-k8s/reaper/pkg/app/reaperapp"
	_ "github.com/reaper-k8s/reaper/pkg/exitline"
	_ "github.com/reaper-k8s/reaper/pkg/reaper"
)

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/reaper-k8s/reaper/internal/cli"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/internal/replay"
)

func init() {
	cli.Register("replay", cli.Command{
		Summary: "run the recorded demo scenarios on a local stack and print what became of each Pod",
		Run:     runReplay,
	})
}

// exitWait is the exit-wait window of the demo: short, so the spot demo
// does not wait the default 3 minutes for its lost Pods.
const exitWait = 5 * time.Second

func runReplay(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	recordings := fs.String("recordings", "testdata/replay", "directory of recorded scenarios")
	if err := fs.Parse(args); err != nil {
		return err
	}
	root, err := replay.ModuleRoot()
	if err != nil {
		return err
	}
	fmt.Println("building the functions and starting the local stack (etcd, kube-apiserver, dynalite, EC2 and SQS test servers)…")
	beat := heartbeat(os.Stdout, "building the functions and starting the local stack")
	lab, stop, err := replay.StartLab(ctx, labstack.Options{}, "reaper-ledger", "REAPER_EXIT_WAIT="+exitWait.String())
	beat()
	if err != nil {
		return err
	}
	defer stop()

	dir := filepath.Join(root, *recordings)
	failed := false
	for _, run := range []func() (replay.Result, error){
		func() (replay.Result, error) { return lab.Replicas30(ctx, dir, os.Stderr) },
		func() (replay.Result, error) { return lab.Spot10(ctx, dir, exitWait, os.Stderr) },
		func() (replay.Result, error) { return lab.SeedJob(ctx, os.Stderr) },
	} {
		res, err := run()
		if err != nil {
			return err
		}
		res.Print(os.Stdout)
		failed = failed || res.Finalized() != len(res.Rows) || res.Leaked() != 0
	}
	if failed {
		return errors.New("some Pods did not end or instances leaked")
	}
	return nil
}

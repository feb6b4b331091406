package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/reaper-k8s/reaper/internal/localstack"
	"github.com/reaper-k8s/reaper/internal/replay"
)

func init() {
	register("replay", subcommand{
		summary: "run the recorded demo scenarios on a local stack and print what became of each Pod",
		run:     runReplay,
	})
}

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
	dir, err := os.MkdirTemp("", "reaper-replay-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	fmt.Println("building the functions and starting the local stack (etcd, kube-apiserver, dynalite, EC2 test server)…")
	bins, err := replay.Build(ctx, root, filepath.Join(dir, "build"), replay.Functions...)
	if err != nil {
		return err
	}
	stack, err := localstack.Start(ctx, localstack.Options{})
	if err != nil {
		return err
	}
	defer stack.Stop()
	lab, err := replay.NewLab(ctx, stack, "reaper-ledger", bins)
	if err != nil {
		return err
	}
	defer lab.Stop()

	res, err := lab.Replicas30(ctx, filepath.Join(root, *recordings))
	if err != nil {
		return err
	}
	res.Print(os.Stdout)
	if res.Finalized() != len(res.Rows) || res.Leaked() != 0 {
		return errors.New("some Pods were not finalized or instances leaked")
	}
	return nil
}

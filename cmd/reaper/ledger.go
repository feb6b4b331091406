package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/reaper-k8s/reaper/internal/cli"
	"github.com/reaper-k8s/reaper/pkg/app"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/model"
)

func init() {
	cli.Register("ledger", cli.Command{
		Summary: "init: create the ledger table named by REAPER_TABLE; get <instance-id>: print an instance's record",
		Run:     runLedger,
	})
}

func runLedger(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("ledger", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: reaper ledger init | reaper ledger get <instance-id>\n\n"+
			"The table is REAPER_TABLE; the endpoint is the SDK's (AWS_ENDPOINT_URL_DYNAMODB for local runs).")
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.Arg(0) == "get" && fs.NArg() == 2 && !model.ValidInstanceID(fs.Arg(1)) {
		return fmt.Errorf("%.40q is not an EC2 instance id: i- and 8 or 17 lower-case hex digits", fs.Arg(1))
	}
	table := os.Getenv("REAPER_TABLE")
	if table == "" {
		return errors.New("REAPER_TABLE is not set")
	}
	cfg, err := app.AWSConfig(ctx)
	if err != nil {
		return err
	}
	db := dynamodb.NewFromConfig(cfg)
	switch {
	case fs.Arg(0) == "init" && fs.NArg() == 1:
		if err := ledger.CreateTable(ctx, db, table); err != nil {
			return err
		}
		fmt.Printf("ledger table %s is ready\n", table)
		return nil
	case fs.Arg(0) == "get" && fs.NArg() == 2:
		rec, ok, err := ledger.New(db, table).Get(ctx, fs.Arg(1))
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("no record for %s", fs.Arg(1))
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rec)
	}
	fs.Usage()
	return errors.New("unknown ledger command")
}

// Command reaper is the operator's tool for Reaper: it creates the ledger table,
// renders a provider's user-data and replays recorded events.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
)

// subcommand is one verb of the CLI. Each lives in its own file and registers
// itself in init, so adding a verb touches no shared code.
type subcommand struct {
	summary string
	run     func(ctx context.Context, args []string) error
}

var subcommands = map[string]subcommand{}

func register(name string, c subcommand) { subcommands[name] = c }

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		os.Exit(2)
	}
	c, ok := subcommands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "reaper: unknown command %q\n\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := c.run(ctx, os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "reaper %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	names := make([]string, 0, len(subcommands))
	for n := range subcommands {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("usage: reaper <command> [arguments]\n\ncommands:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-10s %s\n", n, subcommands[n].summary)
	}
	fmt.Fprint(os.Stderr, b.String())
}

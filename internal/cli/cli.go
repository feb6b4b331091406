// Package cli runs a tool made of verbs: the operator's (cmd/reaper) and
// the lab's (cmd/reaper-lab) each register theirs, so neither links the
// other's code.
package cli

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
)

// Command is one verb of a tool. Each lives in its own file and registers
// itself in init, so adding a verb touches no shared code.
type Command struct {
	Summary string
	Run     func(ctx context.Context, args []string) error
}

var commands = map[string]Command{}

// Register adds the verb name to the tool.
func Register(name string, c Command) { commands[name] = c }

// Main runs the verb named by the first argument and exits: 2 on a usage
// error, 1 when the verb fails.
func Main(tool string) {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage(tool)
		os.Exit(2)
	}
	c, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "%s: unknown command %q\n\n", tool, os.Args[1])
		usage(tool)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := c.Run(ctx, os.Args[2:])
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s %s: %v\n", tool, os.Args[1], err)
		os.Exit(1)
	}
}

func usage(tool string) {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: %s <command> [arguments]\n\ncommands:\n", tool)
	for _, n := range slices.Sorted(maps.Keys(commands)) {
		fmt.Fprintf(&b, "  %-10s %s\n", n, commands[n].Summary)
	}
	fmt.Fprint(os.Stderr, b.String())
}

// Command reaper is the operator's tool for Reaper, what an SRE runs
// against a real account: it creates and reads the ledger table, renders a
// provider's user-data, and checks a deployment (doctor). It links none of
// the lab's code; the demo and the local invokes are cmd/reaper-lab's.
package main

import "github.com/reaper-k8s/reaper/internal/cli"

func main() { cli.Main("reaper") }

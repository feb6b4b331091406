// Command reaper-lab runs Reaper's functions on a local stack (etcd,
// kube-apiserver, dynalite, the EC2 and SQS test servers): the recorded
// demo (replay) and one function on one event (invoke), the docker-free
// twin of `sam local invoke`.
package main

import "github.com/reaper-k8s/reaper/internal/cli"

func main() { cli.Main("reaper-lab") }

// Package bench measures Reaper's exit path against the local stack
// (internal/labstack): a burst of exits through the production
// bootstraps under the Lambda runtime interface emulator with EC2's token
// buckets on, next to the one-call-per-exit baseline; the exitrecorder's
// and the reconciler's handlers in-process, as their mains wire them, with
// the outside requests per exit by kind, allocations and CPU; and the
// bootstraps' init time next to hello-world bootstraps linking the same
// AWS SDK clients. Everything lives in the _test.go files; `make bench`
// runs it and REPORT.md discusses the numbers.
package bench

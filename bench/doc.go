// Package bench measures the exitrecorder's exit path against the local
// stack (internal/localstack): the handler as app.New wires it next to a
// floor that makes only the unavoidable calls, the outside calls per exit by
// kind, allocations, and the bootstrap's init time under the Lambda runtime
// interface emulator next to a hello-world bootstrap. Everything lives in the
// _test.go files; `make bench` runs it and REPORT.md discusses the numbers.
package bench

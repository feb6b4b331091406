# Reaper. `make replay` runs the demo on a local stack; `make test` runs every
# test. Both install or build what they need first (hack/setup.sh, cached in
# ~/.cache/reaper).

FUNCTIONS := exitrecorder statechange sweeper reconciler
GOARCH    ?= arm64
SETUP     := eval "$$(hack/setup.sh)"
# The demo and the local invokes need only the stack: no kube-controller-manager,
# staticcheck or shellcheck.
SETUP_DEMO := eval "$$(hack/setup.sh demo)"
# A synth needs only the CDK CLI and the Go modules: nothing of the stack.
SETUP_DEPLOY := eval "$$(hack/setup.sh deploy)"
GOFLAGS_LAMBDA := -trimpath -tags lambda.norpc -ldflags="-s -w"

.PHONY: all setup build test lint replay invoke bench clean

all: build

setup:
	@hack/setup.sh >/dev/null

# build/<name>/bootstrap for each function: what the CDK assets and
# `sam local invoke` use. `make build GOARCH=amd64` for local runs.
build:
	@for fn in $(FUNCTIONS); do \
		if [ -d functions/$$fn ]; then \
			echo "build build/$$fn/bootstrap ($(GOARCH))"; \
			CGO_ENABLED=0 GOOS=linux GOARCH=$(GOARCH) go build $(GOFLAGS_LAMBDA) -o build/$$fn/bootstrap ./functions/$$fn || exit 1; \
		fi; \
	done

lint: setup
	@$(SETUP) && test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	go vet ./...
	@$(SETUP) && "$$REAPER_STATICCHECK" ./...

test: setup build lint
	@$(SETUP) && go test -count=1 -timeout 25m ./...

# The demo: 30 Pods whose containers exit, replayed through the exitrecorder
# under the Lambda runtime interface emulator against a local stack.
replay:
	@$(SETUP_DEMO) && go run ./cmd/reaper-lab replay

# One function on one sample event, under the Lambda runtime interface
# emulator against a local stack: the docker-free twin of `sam local invoke`.
# The Pod and instance the event talks about are seeded first.
# make invoke FN=exitrecorder EVENT=events/exitrecorder/oom.json [ARGS="-v -env K=V"]
invoke:
	@test -n "$(FN)" -a -n "$(EVENT)" || { echo "usage: make invoke FN=<exitrecorder|statechange|sweeper|reconciler> EVENT=events/<function>/<file>.json [ARGS=\"-v -keep-stack -env K=V\"]" >&2; exit 2; }
	@$(SETUP_DEMO) && go run ./cmd/reaper-lab invoke -fn $(FN) -event $(EVENT) $(ARGS)

bench: setup
	@$(SETUP) && go test -run '^$$' -bench . -benchmem -benchtime 1x -timeout 150m ./bench/...

# cdk.out/<stack>.template.json and its assets; needs no AWS account or
# credentials. `sam local invoke -t cdk.out/Reaper-<cluster>.template.json` runs on it.
# Knobs (docs/reference.md, "CDK context knobs") go in CDK_CONTEXT, e.g.
# make synth CDK_CONTEXT="-c eksCluster=prod -c alarmEmail=ops@example.com"
.PHONY: synth
synth: build
	@$(SETUP_DEPLOY) && "$$REAPER_CDK" synth --quiet --no-lookups $(CDK_CONTEXT)

# build/charts/reaper-<version>.tgz, the version being Chart.yaml's: the chart
# charts/reaper linted as `helm lint --strict` and packaged as `helm package`,
# with Helm's Go library (no helm CLI needed).
.PHONY: chart
chart:
	go run ./deploy/packagechart -dest build/charts

clean:
	rm -rf build cdk.out

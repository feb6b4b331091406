#!/bin/sh
# reaper-wrapper: supervises the one Pod container of a Reaper instance.
#
# Runs the container (never with --rm), waits for it, reads its real state
# (exit code, OOMKilled, start and finish times) before removing it, and
# appends one exit line v1 per container exit to the exit log, which the
# CloudWatch agent ships. Restarts in place when the restartPolicy says so
# (backoff 10 s doubling to 300 s, reset after 10 min of running), rides out a
# restart of the container runtime, and powers the host off once the workload
# is terminal: as soon as the agent has shipped the final line
# (REAPER_SHUTDOWN_MODE=when-shipped), at the latest after the shutdown delay.
#
# A SIGKILL (the OOM killer, kill -9) skips every trap: systemd restarts the
# wrapper (Restart=on-failure), which picks up where the killed one stopped.
# It adopts the container of the current run, running or exited, instead of
# starting a second one, and reports its exit unless a line already did (the
# exit log is the record of what was said). The restart count is saved before
# the line that uses it: the state file holds N+1 before line N is written,
# so after a kill at any point no line reuses a count.
#
# Each line carries the launch's exit token (REAPER_EXIT_TOKEN in the
# configuration), when it has one: the proof that the line comes from this
# instance's host. The wrapper's own log never shows it.
#
# Configuration: the file named by $1 or REAPER_CONFIG (default
# /etc/reaper/workload.conf), written by the Reaper user-data.
# Knobs from the environment [default]:
#   REAPER_STATE_DIR [/var/lib/reaper]      next restart count, terminal marker
#   REAPER_IMDS_URL [http://169.254.169.254] instance metadata (IMDSv2)
#   REAPER_INSTANCE_ID_FILE [/var/lib/cloud/data/instance-id] IMDS fallback
#   REAPER_TIME_SCALE [1]                   divides every sleep (tests)
#   REAPER_RUNTIME_TIMEOUT [600]            seconds to wait for the runtime
#   REAPER_PULL_ATTEMPTS [5]                image pull attempts
#   REAPER_SHUTDOWN_CMD [shutdown -P now]   how the host powers off
#   REAPER_AGENT_STATE_DIR [/opt/aws/amazon-cloudwatch-agent/logs/state]
#                                           the CloudWatch agent's read offsets
#
# Whatever goes wrong (bad configuration, runtime gone, the script itself
# failing), the wrapper ends by powering the host off: never a leaked instance.

state=${REAPER_STATE_DIR:-/var/lib/reaper}
imds=${REAPER_IMDS_URL:-http://169.254.169.254}
iid_file=${REAPER_INSTANCE_ID_FILE:-/var/lib/cloud/data/instance-id}
scale=${REAPER_TIME_SCALE:-1}
runtime_timeout=${REAPER_RUNTIME_TIMEOUT:-600}
pull_attempts=${REAPER_PULL_ATTEMPTS:-5}
shutdown_cmd=${REAPER_SHUTDOWN_CMD:-shutdown -P now}
agent_dir=${REAPER_AGENT_STATE_DIR:-/opt/aws/amazon-cloudwatch-agent/logs/state}
ship_end=
conf=${1:-${REAPER_CONFIG:-/etc/reaper/workload.conf}}
zero=0001-01-01T00:00:00Z
fmt='{{.State.Status}}|{{.State.ExitCode}}|{{.State.OOMKilled}}|{{.State.StartedAt}}|{{.State.FinishedAt}}|{{.Id}}|{{.State.Error}}'

# Defaults, so that the host still powers off when the configuration is bad.
REAPER_CLI=docker REAPER_SHUTDOWN_DELAY=600 REAPER_MAX_RESTARTS=0 REAPER_SHUTDOWN_MODE=when-shipped REAPER_POD_WRITTEN_TAG=''
REAPER_EXIT_LOG=/var/log/reaper/exit.log REAPER_CONTAINER='' REAPER_IMAGE=''
REAPER_RESTART_POLICY='' REAPER_POD_JSON='' REAPER_RUN_ARGS='' REAPER_EXIT_TOKEN=''

log() { printf 'reaper-wrapper: %s\n' "$*" >&2; }

int() { case $1 in '' | *[!0-9]*) return 1 ;; esac; }

# nap SECONDS: sleeps SECONDS divided by REAPER_TIME_SCALE.
nap() { sleep "$(awk -v s="$1" -v k="$scale" 'BEGIN { printf "%g\n", s / k }')"; }

now() { date -u +%Y-%m-%dT%H:%M:%SZ; }

# size F: the size of file F in bytes, 0 when it cannot be read.
size() {
	sz=$(wc -c 2>/dev/null <"$1" | tr -dc 0-9)
	echo "${sz:-0}"
}

# agent_offset: prints the CloudWatch agent's offset in the exit log, the end
# of what its sender is done with (accepted by PutLogEvents, or given up on
# for good); fails while there is none. The agent rewrites its state file in
# place every 100 ms, so the file can be missing, empty or cut short: line 1
# counts only with its newline. Line 3 (the byte ranges) is not needed: line
# 1 is their highest end, and the final line is the last one in the file.
agent_offset() {
	IFS= read -r ao 2>/dev/null <"$agent_state" && int "$ao" && echo "$ao"
}

# json_str S: S as a JSON string (control characters dropped).
json_str() {
	printf '"%s"' "$(printf '%s' "$1" | tr '\t\n\r' '   ' | tr -d '\000-\037' | sed 's/\\/\\\\/g; s/"/\\"/g')"
}

# elapsed A B: whole seconds from RFC 3339 UTC time A to B, 0 if unreadable.
elapsed() {
	awk -v a="$1" -v b="$2" '
	function t(s,   f, y, m) {
		if (s !~ /^[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9]/) return -1
		split(s, f, /[-T:Z.]/)
		y = f[1] + 0; m = f[2] + 0
		if (m <= 2) { y--; m += 12 }
		return (365 * y + int(y / 4) - int(y / 100) + int(y / 400) + int((153 * (m - 3) + 2) / 5) + f[3]) * 86400 + f[4] * 3600 + f[5] * 60 + f[6]
	}
	BEGIN { x = t(a); z = t(b); print (x < 0 || z < x) ? 0 : int(z - x) }'
}

# signame N: the name of signal N, empty when not a common one.
signame() {
	case $1 in
	1) echo SIGHUP ;; 2) echo SIGINT ;; 3) echo SIGQUIT ;; 4) echo SIGILL ;;
	6) echo SIGABRT ;; 7) echo SIGBUS ;; 8) echo SIGFPE ;; 9) echo SIGKILL ;;
	10) echo SIGUSR1 ;; 11) echo SIGSEGV ;; 12) echo SIGUSR2 ;; 13) echo SIGPIPE ;;
	14) echo SIGALRM ;; 15) echo SIGTERM ;;
	esac
}

# metadata PATH: GETs meta-data/PATH through IMDSv2 (a token, then PATH).
metadata() {
	tok=$(curl -fsS -m 2 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' "$imds/latest/api/token") &&
		curl -fsS -m 2 -H "X-aws-ec2-metadata-token: $tok" "$imds/latest/meta-data/$1"
} 2>/dev/null

# instance_id: sets iid from IMDSv2, else from the file cloud-init keeps;
# stays empty when neither answers.
instance_id() {
	case ${iid:-} in i-*) return 0 ;; esac
	iid=
	if id=$(metadata instance-id); then
		case $id in i-*) iid=$id ;; esac
	fi
	[ -n "$iid" ] || iid=$(sed -n '1s/^\(i-[0-9a-f]*\)$/\1/p' "$iid_file" 2>/dev/null)
	[ -n "$iid" ]
}

runtime_up() { "$REAPER_CLI" info >/dev/null 2>&1; }

# wait_runtime: polls the runtime once a second, REAPER_RUNTIME_TIMEOUT times.
wait_runtime() {
	n=0
	until runtime_up; do
		n=$((n + 1))
		[ "$n" -ge "$runtime_timeout" ] && return 1
		[ "$n" -eq 1 ] && log "container runtime not answering; waiting up to ${runtime_timeout}s"
		nap 1
	done
}

# inspect C: sets st_* from the runtime's record of container C.
inspect() {
	out=$("$REAPER_CLI" container inspect --format "$fmt" "$1" 2>/dev/null) || return 1
	IFS='|' read -r st_status st_code st_oom st_started st_finished st_id st_error <<EOF
$out
EOF
	case $st_code in -1 | [0-9] | [0-9][0-9] | [0-9][0-9][0-9]) ;; *) st_code=-1 ;; esac
	[ "$st_oom" = true ] || st_oom=false
	# podman prints Go's time.Time form; make it RFC 3339.
	st_started=$(printf '%s' "$st_started" | sed 's/^\([0-9-]*\) \([0-9:.]*\) +0000 UTC$/\1T\2Z/')
	st_finished=$(printf '%s' "$st_finished" | sed 's/^\([0-9-]*\) \([0-9:.]*\) +0000 UTC$/\1T\2Z/')
	case $st_started in 0001-* | '') st_started=$zero ;; esac
	case $st_finished in 0001-* | '') st_finished=$(now) ;; esac
	return 0
}

# ensure_image: pulls the image when it is missing, with backoff.
ensure_image() {
	"$REAPER_CLI" image inspect "$REAPER_IMAGE" >/dev/null 2>&1 && return 0
	n=1 d=10
	until "$REAPER_CLI" pull "$REAPER_IMAGE" >&2; do
		[ "$n" -ge "$pull_attempts" ] && return 1
		log "pull of $REAPER_IMAGE failed (attempt $n); next in ${d}s"
		nap "$d"
		n=$((n + 1)) d=$((d * 2))
		[ "$d" -gt 300 ] && d=300
	done
}

# shellcheck disable=SC2120 # its arguments come from REAPER_RUN_ARGS
# start: runs container $name. Returns 0 when it runs (cid set), 1 when its
# outcome is already known (x_* set), 2 when the runtime never came back.
start() {
	while :; do
		ensure_image || log "image $REAPER_IMAGE is not available; trying to run anyway"
		eval "set -- $REAPER_RUN_ARGS"
		if cid=$("$REAPER_CLI" run -d --name "$name" "$@" 2>"$state/run.err"); then
			cid=$(printf '%s\n' "$cid" | sed -n '$p')
			return 0
		fi
		msg=$(grep . "$state/run.err" | tail -n 1 | cut -c1-400)
		if inspect "$name"; then
			cid=$st_id
			# The client failed but the container runs: wait on it.
			case $st_status in running | paused | restarting) return 0 ;; esac
			# Created but not started (bad entrypoint, ...): report what the runtime says.
			err=${st_error:-$msg}
			x_code=$st_code x_oom=$st_oom x_started=$st_started x_finished=$st_finished
			return 1
		fi
		if ! runtime_up; then
			wait_runtime || return 2
			continue
		fi
		err="$REAPER_CLI run failed: $msg" cid=''
		x_code=-1 x_oom=false x_started=$zero x_finished=$(now)
		return 1
	done
}

# await: waits for container $cid to end and sets x_* from its real state.
# Returns 2 when the runtime never came back.
await() {
	while :; do
		if w=$("$REAPER_CLI" wait "$cid" 2>/dev/null); then
			:
		else
			# The wait lost its daemon (runtime restart) or the container.
			rr=true w=
			log "wait on $cid failed; checking the container runtime"
			nap 1
			wait_runtime || return 2
		fi
		if inspect "$cid"; then
			case $st_status in
			running | paused | restarting)
				nap 1
				continue
				;;
			esac
			x_code=$st_code x_oom=$st_oom x_started=$st_started x_finished=$st_finished
			[ -n "$st_error" ] && err=$st_error
			return 0
		fi
		if runtime_up; then
			# Gone (removed behind our back): keep what docker wait said, if anything.
			int "$w" || w=-1
			x_code=$w x_oom=false x_started=$zero x_finished=$(now)
			err="container $cid vanished before its state could be read"
			return 0
		fi
		rr=true
		wait_runtime || return 2
	done
}

# emit WILL_RESTART [BACKOFF]: appends the exit line for the current run.
emit() {
	# Reaper rejects a line without the instance id: try for a while.
	n=0
	until instance_id || [ "$n" -ge 10 ]; do
		n=$((n + 1))
		nap 1
	done
	[ -n "$iid" ] || log "instance id unknown (IMDS and $iid_file did not answer)"
	sig=
	if [ "$x_code" -gt 128 ] && [ "$x_code" -lt 160 ]; then sig=$(signame $((x_code - 128))); fi
	line="{\"reaper\":\"container-exit\",\"v\":1,\"instanceId\":$(json_str "$iid"),$REAPER_POD_JSON"
	line="$line,\"containerId\":$(json_str "$cid"),\"exitCode\":$x_code,\"oomKilled\":$x_oom"
	line="$line,\"startedAt\":$(json_str "$x_started"),\"finishedAt\":$(json_str "$x_finished")"
	line="$line,\"restartCount\":$restarts,\"willRestart\":$1,\"runtimeRestarted\":$rr"
	[ -n "$sig" ] && line="$line,\"signal\":\"$sig\""
	[ -n "${2:-}" ] && line="$line,\"backoffSeconds\":$2"
	[ -n "$err" ] && line="$line,\"error\":$(json_str "$(printf '%s' "$err" | cut -c1-400)")"
	line="$line}"
	# The token goes in the exit log only, never in the wrapper's own log.
	record=$line
	[ -n "$REAPER_EXIT_TOKEN" ] && record="${line%\}},\"token\":$(json_str "$REAPER_EXIT_TOKEN")}"
	mkdir -p "${REAPER_EXIT_LOG%/*}"
	s0=$(size "$REAPER_EXIT_LOG")
	v0=$(agent_offset) || v0=0
	# One write per line: lines never interleave.
	if ! printf '%s\n' "$record" >>"$REAPER_EXIT_LOG"; then
		log "cannot append to $REAPER_EXIT_LOG"
	elif [ "$1" = false ] && [ "$REAPER_SHUTDOWN_MODE" = when-shipped ]; then
		# An offset past the file's end belongs to an earlier file of that
		# name (recreated, or left in the AMI): it would prove nothing.
		if [ "$v0" -gt "$s0" ]; then
			log "agent offset $v0 is past the end of $REAPER_EXIT_LOG ($s0 bytes): stale, not waiting for it"
		else
			ship_end=$(size "$REAPER_EXIT_LOG")
			[ "$ship_end" -gt "$s0" ] || ship_end=
		fi
	fi
	log "exit line: $line"
}

# said TEXT: whether a line of the exit log contains TEXT.
said() { grep -qF "$1" "$REAPER_EXIT_LOG" 2>/dev/null; }

# shipping: after a final line written before this start, waits in
# reap_host for the agent to ship the whole exit log, unless its offset is
# past the log's end (stale).
shipping() {
	ship_end=$(size "$REAPER_EXIT_LOG")
	v0=$(agent_offset) || v0=0
	[ "$REAPER_SHUTDOWN_MODE" = when-shipped ] && [ "$ship_end" -gt 0 ] && [ "$v0" -le "$ship_end" ] || ship_end=
}

# reap_host: powers the host off once the workload is terminal (the instance
# is launched with shutdown behavior terminate). After a final line
# (ship_end: its end in the exit log), as soon as the agent's offset reaches
# it: the line is then in CloudWatch Logs, which delivers it to Reaper
# without the host, so no grace period follows. Otherwise, and when the agent
# does not get there, after the delay: the last resort when the reaper has
# not terminated the instance (it normally does within seconds).
reap_host() {
	if [ "$REAPER_SHUTDOWN_MODE" = when-pod-written ]; then
		# Reaper tags the instance once its Pod tells the exit.
		n=0
		until metadata "tags/instance/$REAPER_POD_WRITTEN_TAG" >/dev/null || [ "$n" -ge "$REAPER_SHUTDOWN_DELAY" ]; do
			nap 1
			n=$((n + 1))
		done
		log "waited ${n}s for tag $REAPER_POD_WRITTEN_TAG"
	elif [ -n "$ship_end" ]; then
		log "workload is terminal; powering off once the agent has shipped the exit line, at the latest in ${REAPER_SHUTDOWN_DELAY}s"
		n=0 off=
		until [ "$n" -ge "$REAPER_SHUTDOWN_DELAY" ]; do
			nap 1
			n=$((n + 1))
			off=$(agent_offset) && [ "$off" -ge "$ship_end" ] && break
		done
		if [ -n "$off" ] && [ "$off" -ge "$ship_end" ]; then
			log "exit line shipped after ${n}s (agent offset $off, line end $ship_end)"
		else
			log "exit line not shipped within ${REAPER_SHUTDOWN_DELAY}s (agent offset ${off:-none}, line end $ship_end)"
		fi
	else
		log "workload is terminal; powering off in ${REAPER_SHUTDOWN_DELAY}s unless terminated first"
		nap "$REAPER_SHUTDOWN_DELAY"
	fi
	while :; do
		log "powering off: $shutdown_cmd"
		# shellcheck disable=SC2086 # a command line, split on purpose
		if $shutdown_cmd; then
			trap - EXIT
			exit 0
		fi
		log "power-off command failed; retrying in 60s"
		nap 60
	done
}

trap 'log "exiting unexpectedly"; reap_host' EXIT
case $scale in '' | 0 | *[!0-9.]*) scale=1 ;; esac
int "$runtime_timeout" || runtime_timeout=600
int "$pull_attempts" || pull_attempts=5
mkdir -p "$state" || log "cannot create $state"
if [ ! -r "$conf" ]; then
	log "cannot read $conf"
	reap_host
fi
# shellcheck source=/dev/null
. "$conf"
int "$REAPER_SHUTDOWN_DELAY" || REAPER_SHUTDOWN_DELAY=600
int "$REAPER_MAX_RESTARTS" || REAPER_MAX_RESTARTS=0
# The agent names a file's state after its path, with /, space and : as _.
agent_state=$agent_dir/$(printf '%s' "$REAPER_EXIT_LOG" | tr '/ :' '___')
if [ -z "$REAPER_CONTAINER" ] || [ -z "$REAPER_IMAGE" ] || [ -z "$REAPER_POD_JSON" ]; then
	log "$conf lacks REAPER_CONTAINER, REAPER_IMAGE or REAPER_POD_JSON"
	reap_host
fi
if [ -e "$state/terminal" ]; then
	log "workload already terminal before this start"
	# Killed while waiting to power off: the final line is in the exit log.
	shipping
	reap_host
fi
# The state file holds the count of the next run: every line written so far
# has a lower one.
restarts=$(cat "$state/restarts" 2>/dev/null) || restarts=0
int "$restarts" || restarts=0
backoff=10
iid=
tries=0
until instance_id || [ "$tries" -ge 5 ]; do
	tries=$((tries + 1))
	nap 1
done
# Killed between saving count N+1 and removing container N: container N is
# still there, its exit reported or not. Finish its run first.
if [ "$restarts" -gt 0 ] && wait_runtime && inspect "reaper-$REAPER_CONTAINER-$((restarts - 1))"; then
	restarts=$((restarts - 1))
fi

while :; do
	name=reaper-$REAPER_CONTAINER-$restarts
	err='' rr=false cid='' fatal=''
	if ! wait_runtime; then
		fatal="container runtime did not answer for ${runtime_timeout}s"
	elif inspect "$name"; then
		# A container of this run already exists: the wrapper itself was restarted.
		cid=$st_id
		case $st_status in
		running | paused | restarting) log "adopting running container $name" ;;
		*) err="container had already exited when the supervisor started" ;;
		esac
		x_code=$st_code x_oom=$st_oom x_started=$st_started x_finished=$st_finished
		case $st_status in
		running | paused | restarting) await || fatal="container runtime did not come back within ${runtime_timeout}s" ;;
		esac
	else
		start
		case $? in
		0) log "started $name ($cid)"; await || fatal="container runtime did not come back within ${runtime_timeout}s" ;;
		2) fatal="container runtime did not come back within ${runtime_timeout}s" ;;
		esac
	fi
	if [ -n "$fatal" ]; then
		err=$fatal rr=false x_code=-1 x_oom=false x_started=$zero x_finished=$(now)
	fi
	# One line per exit, and never two with one count: a killed wrapper's
	# line for this container may be in the exit log already.
	told=
	[ -n "$cid" ] && said "\"containerId\":\"$cid\"" && told=1 && log "exit of $cid already reported"
	while [ -z "$told" ] && said "\"restartCount\":$restarts,"; do restarts=$((restarts + 1)); done

	will=false
	case $REAPER_RESTART_POLICY in
	Always) will=true ;;
	OnFailure) [ "$x_code" -ne 0 ] && will=true ;;
	esac
	[ -n "$fatal" ] && will=false
	if [ "$will" = true ] && [ "$REAPER_MAX_RESTARTS" -gt 0 ] && [ "$restarts" -ge "$REAPER_MAX_RESTARTS" ]; then
		log "restart limit $REAPER_MAX_RESTARTS reached"
		will=false
	fi
	# The count of the next run goes to disk before this run's line.
	echo $((restarts + 1)) >"$state/restarts"
	if [ "$will" = false ]; then
		if [ -n "$told" ]; then shipping; else emit false; fi
		: >"$state/terminal"
		reap_host
	fi

	# kubelet: a container that ran 10 minutes starts over at the initial delay.
	[ "$(elapsed "$x_started" "$x_finished")" -ge 600 ] && backoff=10
	[ -n "$told" ] || emit true "$backoff"
	if [ -n "$cid" ]; then
		"$REAPER_CLI" rm -f "$cid" >/dev/null 2>&1 || log "could not remove $cid"
	fi
	restarts=$((restarts + 1))
	log "restarting in ${backoff}s (restart $restarts)"
	nap "$backoff"
	backoff=$((backoff * 2))
	[ "$backoff" -gt 300 ] && backoff=300
done

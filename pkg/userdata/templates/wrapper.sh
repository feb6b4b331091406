#!/bin/sh
# reaper-wrapper: runs the one Pod of a Reaper instance, as the kubelet would,
# and reports every container exit.
#
# The Pod's containers run in spec order: each regular init container to
# completion, native sidecars (init containers with restartPolicy Always)
# started and kept running, then every regular container at once. Each
# container has its own supervision loop, in the background: it runs the
# container (never with --rm), waits for it, reads its real state (exit
# code, OOMKilled, start and finish times, termination message) before
# removing it, and appends one exit line v1 per run to the exit log, which
# the CloudWatch agent ships. It restarts in place when the kind and the
# restartPolicy say so (backoff 10 s doubling to 300 s, reset after 10 min
# of running) and rides out a restart of the container runtime. Once every
# regular container has ended for good (or an init container has failed
# for good), the sidecars are stopped in reverse order (SIGTERM, SIGKILL
# after the grace period), and the host powers off once the Pod's last line
# is out: as soon as the agent has shipped it
# (REAPER_SHUTDOWN_MODE=when-shipped), at the latest after the shutdown delay.
#
# Containers of a Pod of several share one network namespace, that of a
# pause container (reaper-pause), and the Pod's emptyDir volumes, host
# directories under the state directory.
#
# A SIGKILL (the OOM killer, kill -9) skips every trap: systemd restarts the
# wrapper (Restart=on-failure), which picks up where the killed one stopped.
# Each container's loop adopts the container of its current run, running or
# exited, instead of starting a second one, and reports its exit unless a
# line already did (the exit log is the record of what was said). A
# container's restart count is saved before the line that uses it: its
# state file holds N+1 before line N is written, so after a kill at any
# point no line reuses a count. A container that ended for good is marked
# done, and a Pod that ends (every regular container done, or an init
# container failed for good) is marked ending: a restarted wrapper starts
# neither again.
#
# Each line carries the launch's exit token (REAPER_EXIT_TOKEN in the
# configuration), when it has one: the proof that the line comes from this
# instance's host. The wrapper's own log never shows it.
#
# Configuration: the file named by $1 or REAPER_CONFIG (default
# /etc/reaper/workload.conf), written by the Reaper user-data.
# Knobs from the environment [default]:
#   REAPER_STATE_DIR [/var/lib/reaper]      restart counts, markers, volumes
#   REAPER_IMDS_URL [http://169.254.169.254] instance metadata (IMDSv2)
#   REAPER_INSTANCE_ID_FILE [/var/lib/cloud/data/instance-id] IMDS fallback
#   REAPER_TIME_SCALE [1]                   divides every sleep (tests)
#   REAPER_RUNTIME_TIMEOUT [600]            seconds to wait for the runtime
#   REAPER_PULL_ATTEMPTS [5]                image pull attempts
#   REAPER_SHUTDOWN_CMD [shutdown -P now]   how the host powers off
#   REAPER_AGENT_STATE_DIR [/opt/aws/amazon-cloudwatch-agent/logs/state]
#                                           the CloudWatch agent's read offsets
#
# State (under REAPER_STATE_DIR): a Pod of one container keeps its files in
# the directory itself, a Pod of several in c/<container>/ each: restarts
# (the count of the next run), cid (the current run's container), up (it
# has started once), done (ended for good), stop (the Pod stops it),
# termination-log (bind-mounted at its terminationMessagePath). Pod-wide:
# ending, ship_end (where the Pod's last line ends in the exit log),
# terminal, lock, volumes/<name>.
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
REAPER_EXIT_LOG=/var/log/reaper/exit.log REAPER_RESTART_POLICY='' REAPER_POD_JSON='' REAPER_EXIT_TOKEN=''
REAPER_CONTAINERS=0 REAPER_GRACE=30 REAPER_MSG_MAX=4096 REAPER_VOLUMES='' REAPER_PAUSE_IMAGE='' REAPER_PAUSE_RUN_ARGS=''

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

# json_tail MAX: the bytes on stdin as a JSON string of at most MAX bytes of
# UTF-8, their tail: a character cut at the front is dropped, an invalid
# byte becomes U+FFFD (counted as its 3 bytes), and everything outside
# printable ASCII is escaped, so the line stays valid JSON and valid UTF-8
# whatever the bytes.
json_tail() {
	od -An -v -tu1 | awk -v max="$1" '
	{ for (f = 1; f <= NF; f++) b[n++] = $f + 0 }
	END {
		i = 0
		while (i < n && i < 3 && b[i] >= 128 && b[i] < 192) i++
		m = 0
		while (i < n) {
			c = b[i]; len = 0
			if (c < 128) { cp = c; len = 1 }
			else if (c >= 194 && c < 224) { cp = c - 192; len = 2 }
			else if (c >= 224 && c < 240) { cp = c - 224; len = 3 }
			else if (c >= 240 && c < 245) { cp = c - 240; len = 4 }
			ok = len > 0 && i + len <= n
			for (k = 1; ok && k < len; k++) {
				d = b[i + k]
				if (d < 128 || d >= 192) ok = 0
				else cp = cp * 64 + d - 128
			}
			if (ok && len == 3 && (cp < 2048 || (cp >= 55296 && cp < 57344))) ok = 0
			if (ok && len == 4 && (cp < 65536 || cp > 1114111)) ok = 0
			if (!ok) { cp = 65533; len = 1; w[m] = 3 } else w[m] = len
			u[m++] = cp; i += len
		}
		t = 0; s = m
		while (s > 0 && t + w[s - 1] <= max) { s--; t += w[s] }
		out = ""
		for (k = s; k < m; k++) {
			cp = u[k]
			if (cp == 34) out = out "\\\""
			else if (cp == 92) out = out "\\\\"
			else if (cp >= 32 && cp < 127) out = out sprintf("%c", cp)
			else if (cp < 65536) out = out sprintf("\\u%04x", cp)
			else { cp -= 65536; out = out sprintf("\\u%04x\\u%04x", 55296 + int(cp / 1024), 56320 + cp % 1024) }
		}
		printf "\"%s\"", out
	}'
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

# ensure_image IMAGE: pulls IMAGE when it is missing, with backoff.
ensure_image() {
	"$REAPER_CLI" image inspect "$1" >/dev/null 2>&1 && return 0
	n=1 d=10
	until "$REAPER_CLI" pull "$1" >&2; do
		[ "$n" -ge "$pull_attempts" ] && return 1
		log "pull of $1 failed (attempt $n); next in ${d}s"
		nap "$d"
		n=$((n + 1)) d=$((d * 2))
		[ "$d" -gt 300 ] && d=300
	done
}

# cvar I FIELD: prints REAPER_C<I>_<FIELD> of the configuration.
cvar() { eval "printf '%s' \"\${REAPER_C$1_$2:-}\""; }

# cdir I: the state directory of container I.
cdir() {
	if [ "$REAPER_CONTAINERS" -eq 1 ]; then echo "$state"; else echo "$state/c/$(cvar "$1" NAME)"; fi
}

# load I: makes container I the current one (c* and cs).
load() {
	ci=$1 cname=$(cvar "$1" NAME) ckind=$(cvar "$1" KIND) cimage=$(cvar "$1" IMAGE)
	cmsg=$(cvar "$1" MSG) crun=$(cvar "$1" RUN_ARGS) cs=$(cdir "$1")
}

# lock, unlock: one container's loop at a time decides and writes a line.
# mkdir is atomic; a lock left by a killed wrapper is removed at start.
lock() { until mkdir "$state/lock" 2>/dev/null; do nap 0.05; done; }
unlock() { rmdir "$state/lock"; }

# shellcheck disable=SC2120 # its arguments come from the container's run args
# start: runs container $name. Returns 0 when it runs (cid set), 1 when its
# outcome is already known (x_* set), 2 when the runtime never came back.
start() {
	while :; do
		ensure_image "$cimage" || log "image $cimage is not available; trying to run anyway"
		eval "set -- $crun"
		if cid=$("$REAPER_CLI" run -d --name "$name" "$@" 2>"$cs/run.err"); then
			cid=$(printf '%s\n' "$cid" | sed -n '$p')
			return 0
		fi
		msg=$(grep . "$cs/run.err" | tail -n 1 | cut -c1-400)
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

# running: notes that container $cid of the current run is up, and stops
# it at once when the Pod has meanwhile stopped its container (a sidecar
# restarted as the Pod ends).
running() {
	printf '%s\n' "$cid" >"$cs/cid"
	: >"$cs/up"
	: >"$cs/run"
	[ -e "$cs/stop" ] && "$REAPER_CLI" stop -t "$REAPER_GRACE" "$cid" >/dev/null 2>&1
	return 0
}

# message: the current run's termination message as a JSON string, as the
# kubelet reads it; nothing when it has none. The file at its
# terminationMessagePath, its tail within the Pod's share; under
# FallbackToLogsOnError, when the container failed and the file is empty,
# the tail of its log (80 lines, 2,048 bytes at most).
message() {
	[ -n "$cmsg" ] || return 0
	f=$cs/termination-log max=$REAPER_MSG_MAX
	if [ ! -s "$f" ] && [ "$cmsg" = FallbackToLogsOnError ] && [ "$x_code" -ne 0 ] && [ -n "$cid" ]; then
		f=$cs/log-tail
		"$REAPER_CLI" logs --tail 80 "$cid" >"$f" 2>&1 || : >"$f"
		[ "$max" -gt 2048 ] && max=2048
	fi
	[ -s "$f" ] && tail -c "$max" "$f" | json_tail "$max"
}

# others: whether other containers of the Pod still run or are still to
# start after the current run's line (the line's othersRunning). Called
# under the lock; a final exit of a failed init container, or of the last
# regular container, marks the Pod ending: from then on nothing starts or
# restarts, and only the containers running count.
others() {
	if [ "$will" = false ]; then
		case $ckind in
		init) [ "$x_code" -ne 0 ] && : >"$state/ending" ;;
		main)
			j=1 last=1
			while [ "$j" -le "$REAPER_CONTAINERS" ]; do
				[ "$j" -ne "$ci" ] && [ "$(cvar "$j" KIND)" = main ] && [ ! -e "$(cdir "$j")/done" ] && last=
				j=$((j + 1))
			done
			[ -n "$last" ] && : >"$state/ending"
			;;
		esac
	fi
	j=1
	while [ "$j" -le "$REAPER_CONTAINERS" ]; do
		d=$(cdir "$j")
		if [ "$j" -ne "$ci" ] && [ ! -e "$d/done" ]; then
			[ ! -e "$state/ending" ] || [ -e "$d/run" ] && return 0
		fi
		j=$((j + 1))
	done
	return 1
}

# settle: a sidecar is not restarted once the Pod ends (or stops it).
# Decided under the lock, with the other containers' lines.
settle() {
	if [ "$ckind" = sidecar ] && { [ -e "$cs/stop" ] || [ -e "$state/ending" ]; }; then will=false; fi
}

# emit BACKOFF: appends the exit line for the current run, restarted after
# BACKOFF seconds if will is true. A final line (will false) marks the
# container done; the Pod's last line also notes, for the power-off, where
# it ends in the exit log.
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
	msg=$(message)
	lock
	settle
	more=false
	others && more=true
	line="{\"reaper\":\"container-exit\",\"v\":1,\"instanceId\":$(json_str "$iid"),$REAPER_POD_JSON"
	line="$line,\"container\":$(json_str "$cname"),\"restartCount\":$restarts"
	line="$line,\"containerId\":$(json_str "$cid"),\"exitCode\":$x_code,\"oomKilled\":$x_oom"
	line="$line,\"startedAt\":$(json_str "$x_started"),\"finishedAt\":$(json_str "$x_finished")"
	line="$line,\"willRestart\":$will,\"runtimeRestarted\":$rr"
	[ "$more" = true ] && line="$line,\"othersRunning\":true"
	[ -n "$sig" ] && line="$line,\"signal\":\"$sig\""
	[ "$will" = true ] && line="$line,\"backoffSeconds\":$1"
	[ -n "$err" ] && line="$line,\"error\":$(json_str "$(printf '%s' "$err" | cut -c1-400)")"
	[ -n "$msg" ] && [ "$msg" != '""' ] && line="$line,\"message\":$msg"
	line="$line}"
	# The token goes in the exit log only, never in the wrapper's own log.
	record=$line
	[ -n "$REAPER_EXIT_TOKEN" ] && record="${line%\}},\"token\":$(json_str "$REAPER_EXIT_TOKEN")}"
	mkdir -p "${REAPER_EXIT_LOG%/*}"
	s0=$(size "$REAPER_EXIT_LOG")
	v0=$(agent_offset) || v0=0
	ship_end=
	# One write per line, under the lock: lines never interleave.
	if ! printf '%s\n' "$record" >>"$REAPER_EXIT_LOG"; then
		log "cannot append to $REAPER_EXIT_LOG"
	elif [ "$will" = false ] && [ "$more" = false ] && [ "$REAPER_SHUTDOWN_MODE" = when-shipped ]; then
		# An offset past the file's end belongs to an earlier file of that
		# name (recreated, or left in the AMI): it would prove nothing.
		if [ "$v0" -gt "$s0" ]; then
			log "agent offset $v0 is past the end of $REAPER_EXIT_LOG ($s0 bytes): stale, not waiting for it"
		else
			ship_end=$(size "$REAPER_EXIT_LOG")
			[ "$ship_end" -gt "$s0" ] || ship_end=
		fi
	fi
	if [ "$will" = false ]; then
		: >"$cs/done"
		[ "$more" = false ] && printf '%s\n' "$ship_end" >"$state/ship_end"
	fi
	unlock
	log "exit line: $line"
}

# told: settles a run whose line a killed wrapper wrote already: a final
# one marks the container done, and the Pod's last one the place the
# power-off waits for (the exit log's end).
told() {
	lock
	settle
	if [ "$will" = false ]; then
		if ! others; then
			shipping
			printf '%s\n' "$ship_end" >"$state/ship_end"
		fi
		: >"$cs/done"
	fi
	unlock
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

# supervise I: runs container I, run after run, until it ends for good.
supervise() {
	load "$1"
	mkdir -p "$cs"
	# The state file holds the count of the next run: every line written so
	# far has a lower one.
	restarts=$(cat "$cs/restarts" 2>/dev/null) || restarts=0
	int "$restarts" || restarts=0
	backoff=10
	# Killed between saving count N+1 and removing container N: container N
	# is still there, its exit reported or not. Finish its run first.
	if [ "$restarts" -gt 0 ] && wait_runtime && inspect "reaper-$cname-$((restarts - 1))"; then
		restarts=$((restarts - 1))
	fi
	while :; do
		name=reaper-$cname-$restarts
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
			running | paused | restarting)
				running
				await || fatal="container runtime did not come back within ${runtime_timeout}s"
				;;
			esac
		else
			# A new file for each run, writable by any user of the container.
			if [ -n "$cmsg" ]; then
				: >"$cs/termination-log"
				chmod 0666 "$cs/termination-log"
			fi
			start
			case $? in
			0)
				log "started $name ($cid)"
				running
				await || fatal="container runtime did not come back within ${runtime_timeout}s"
				;;
			2) fatal="container runtime did not come back within ${runtime_timeout}s" ;;
			esac
		fi
		rm -f "$cs/run"
		if [ -n "$fatal" ]; then
			err=$fatal rr=false x_code=-1 x_oom=false x_started=$zero x_finished=$(now)
		fi
		# One line per exit, and never two with one count: a killed wrapper's
		# line for this container may be in the exit log already.
		known=
		[ -n "$cid" ] && said "\"containerId\":\"$cid\"" && known=1 && log "exit of $cid already reported"
		while [ -z "$known" ] && said "\"container\":\"$cname\",\"restartCount\":$restarts,"; do restarts=$((restarts + 1)); done

		# The kubelet's rules: a sidecar is restarted whatever the Pod's
		# policy until the Pod stops it; an init container until it
		# succeeds, unless the policy is Never; a regular container as the
		# policy says.
		will=false
		case $ckind:$REAPER_RESTART_POLICY in
		sidecar:*) [ -e "$cs/stop" ] || will=true ;;
		init:Never) ;;
		init:*) [ "$x_code" -ne 0 ] && will=true ;;
		main:Always) will=true ;;
		main:OnFailure) [ "$x_code" -ne 0 ] && will=true ;;
		esac
		[ -n "$fatal" ] && will=false
		if [ "$will" = true ] && [ "$REAPER_MAX_RESTARTS" -gt 0 ] && [ "$restarts" -ge "$REAPER_MAX_RESTARTS" ]; then
			log "restart limit $REAPER_MAX_RESTARTS reached for $cname"
			will=false
		fi
		# The count of the next run goes to disk before this run's line.
		echo $((restarts + 1)) >"$cs/restarts"
		# kubelet: a container that ran 10 minutes starts over at the initial delay.
		[ "$will" = true ] && [ "$(elapsed "$x_started" "$x_finished")" -ge 600 ] && backoff=10
		if [ -n "$known" ]; then told; else emit "$backoff"; fi
		[ "$will" = false ] && return 0
		if [ -n "$cid" ]; then
			"$REAPER_CLI" rm -f "$cid" >/dev/null 2>&1 || log "could not remove $cid"
		fi
		restarts=$((restarts + 1))
		log "restarting $cname in ${backoff}s (restart $restarts)"
		if [ "$ckind" = sidecar ]; then
			# The Pod may end meanwhile: a sidecar then stays down.
			n=0
			while [ "$n" -lt "$backoff" ] && [ ! -e "$state/ending" ]; do
				nap 1
				n=$((n + 1))
			done
			[ -e "$state/ending" ] && return 0
		else
			nap "$backoff"
		fi
		backoff=$((backoff * 2))
		[ "$backoff" -gt 300 ] && backoff=300
	done
}

# shellcheck disable=SC2120 # its arguments come from REAPER_PAUSE_RUN_ARGS
# pause: starts the container whose network namespace the Pod's
# containers share, unless it runs (a Pod of one container needs none).
pause() {
	[ -n "$REAPER_PAUSE_IMAGE" ] || return 0
	wait_runtime || return 0
	if inspect reaper-pause; then
		case $st_status in running) return 0 ;; esac
		"$REAPER_CLI" start reaper-pause >/dev/null 2>&1 && return 0
		"$REAPER_CLI" rm -f reaper-pause >/dev/null 2>&1
	fi
	ensure_image "$REAPER_PAUSE_IMAGE" || log "image $REAPER_PAUSE_IMAGE is not available; trying to run anyway"
	eval "set -- $REAPER_PAUSE_RUN_ARGS"
	"$REAPER_CLI" run -d --name reaper-pause "$@" >/dev/null 2>"$state/run.err" ||
		log "the Pod's network container did not start: $(grep . "$state/run.err" | tail -n 1 | cut -c1-400)"
}

# stop_sidecars: stops the sidecars whose loops run, in reverse order, each
# with what is left of the grace period (2 s at least, as the kubelet), and
# waits for each one's line.
stop_sidecars() {
	deadline=$(($(date +%s) + REAPER_GRACE))
	for p in $sidecars; do
		i=${p%%:*} pid=${p#*:}
		load "$i"
		: >"$cs/stop"
		left=$((deadline - $(date +%s)))
		[ "$left" -lt 2 ] && left=2
		cid=$(cat "$cs/cid" 2>/dev/null) || cid=
		# Between two runs its loop ends by itself, within a second.
		if [ -e "$cs/run" ] && [ -n "$cid" ] && kill -0 "$pid" 2>/dev/null; then
			log "stopping sidecar $cname (grace ${left}s)"
			"$REAPER_CLI" stop -t "$left" "$cid" >/dev/null 2>&1 || log "could not stop $cid"
		fi
		wait "$pid"
	done
}

# reap_host: powers the host off once the workload is terminal (the instance
# is launched with shutdown behavior terminate). After the Pod's last line
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
int "$REAPER_CONTAINERS" || REAPER_CONTAINERS=0
int "$REAPER_GRACE" || REAPER_GRACE=30
int "$REAPER_MSG_MAX" || REAPER_MSG_MAX=4096
# The agent names a file's state after its path, with /, space and : as _.
agent_state=$agent_dir/$(printf '%s' "$REAPER_EXIT_LOG" | tr '/ :' '___')
if [ "$REAPER_CONTAINERS" -lt 1 ] || [ -z "$(cvar 1 IMAGE)" ] || [ -z "$REAPER_POD_JSON" ]; then
	log "$conf lacks REAPER_CONTAINERS, its containers or REAPER_POD_JSON"
	reap_host
fi
if [ -e "$state/terminal" ]; then
	log "workload already terminal before this start"
	# Killed while waiting to power off: the final line is in the exit log.
	shipping
	reap_host
fi
# No loop runs yet: a lock, or a container noted as running or up, is a
# killed wrapper's. Each loop notes its own again once it has adopted its
# container, and the next container waits for a sidecar's.
rmdir "$state/lock" 2>/dev/null
rm -f "$state/run" "$state/up" "$state"/c/*/run "$state"/c/*/up
iid=
tries=0
until instance_id || [ "$tries" -ge 5 ]; do
	tries=$((tries + 1))
	nap 1
done
for v in $REAPER_VOLUMES; do
	mkdir -p "$state/volumes/$v" && chmod 0777 "$state/volumes/$v"
done
# shellcheck disable=SC2119 # pause takes no arguments of the script
pause

# Init containers in order: a regular one to completion, a sidecar until
# it has started. sidecars lists the running ones' loops, last first.
sidecars='' mains='' i=1
while [ "$i" -le "$REAPER_CONTAINERS" ] && [ ! -e "$state/ending" ]; do
	load "$i"
	if [ ! -e "$cs/done" ]; then
		case $ckind in
		init) (supervise "$i") ;;
		sidecar)
			supervise "$i" &
			pid=$!
			sidecars="$i:$pid $sidecars"
			until [ -e "$cs/up" ] || ! kill -0 "$pid" 2>/dev/null; do nap 0.1; done
			;;
		esac
	fi
	i=$((i + 1))
done
# Then every regular container at once, each in its own loop.
i=1
while [ "$i" -le "$REAPER_CONTAINERS" ] && [ ! -e "$state/ending" ]; do
	load "$i"
	if [ "$ckind" = main ] && [ ! -e "$cs/done" ]; then
		supervise "$i" &
		mains="$mains $!"
	fi
	i=$((i + 1))
done
for pid in $mains; do wait "$pid"; done
stop_sidecars

: >"$state/terminal"
if [ -e "$state/ship_end" ]; then
	ship_end=$(cat "$state/ship_end")
else
	# No line said it was the Pod's last (a sidecar stopped between runs):
	# wait for the agent to ship the whole exit log.
	shipping
fi
reap_host

#!/bin/bash
# Reaper user-data for Pod web/server (uid 11111111-2222-4333-8444-555555555555).
# Rendered by github.com/reaper-k8s/reaper/pkg/userdata; change the Pod, not this.
#
# Installs the workload supervisor (/usr/local/bin/reaper-wrapper, run by reaper-workload.service),
# points the CloudWatch agent at the exit log, and starts both. If a step
# fails, the host powers itself off in 10 min: no instance is left idling.
# REAPER_ROOT (unset on a real host) installs under another root, for tests.
set -Eeuo pipefail
root=${REAPER_ROOT:-}

fail() {
	echo "reaper user-data: failed at line $1; powering off in 10 min" >&2
	shutdown -P +10 "reaper: user-data failed" || true
	exit 1
}
trap 'fail $LINENO' ERR

umask 022
mkdir -p "$root/usr/local/bin" "$root/etc/reaper" "$root/etc/systemd/system" \
	"$root/opt/aws/amazon-cloudwatch-agent/etc" "$root/var/lib/reaper" "$root/var/log/reaper/"

cat >"$root/usr/local/bin/reaper-wrapper" <<'REAPER_EOF'
#!/bin/sh
# reaper-wrapper, from github.com/reaper-k8s/reaper pkg/userdata/templates/wrapper.sh (comments and indentation removed).

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

REAPER_CLI=docker REAPER_SHUTDOWN_DELAY=600 REAPER_MAX_RESTARTS=0 REAPER_SHUTDOWN_MODE=when-shipped REAPER_POD_WRITTEN_TAG=''
REAPER_EXIT_LOG=/var/log/reaper/exit.log REAPER_CONTAINER='' REAPER_IMAGE=''
REAPER_RESTART_POLICY='' REAPER_POD_JSON='' REAPER_RUN_ARGS='' REAPER_EXIT_TOKEN=''

log() { printf 'reaper-wrapper: %s\n' "$*" >&2; }

int() { case $1 in '' | *[!0-9]*) return 1 ;; esac; }

nap() { sleep "$(awk -v s="$1" -v k="$scale" 'BEGIN { printf "%g\n", s / k }')"; }

now() { date -u +%Y-%m-%dT%H:%M:%SZ; }

size() {
sz=$(wc -c 2>/dev/null <"$1" | tr -dc 0-9)
echo "${sz:-0}"
}

agent_offset() {
IFS= read -r ao 2>/dev/null <"$agent_state" && int "$ao" && echo "$ao"
}

json_str() {
printf '"%s"' "$(printf '%s' "$1" | tr '\t\n\r' '   ' | tr -d '\000-\037' | sed 's/\\/\\\\/g; s/"/\\"/g')"
}

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

signame() {
case $1 in
1) echo SIGHUP ;; 2) echo SIGINT ;; 3) echo SIGQUIT ;; 4) echo SIGILL ;;
6) echo SIGABRT ;; 7) echo SIGBUS ;; 8) echo SIGFPE ;; 9) echo SIGKILL ;;
10) echo SIGUSR1 ;; 11) echo SIGSEGV ;; 12) echo SIGUSR2 ;; 13) echo SIGPIPE ;;
14) echo SIGALRM ;; 15) echo SIGTERM ;;
esac
}

metadata() {
tok=$(curl -fsS -m 2 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' "$imds/latest/api/token") &&
curl -fsS -m 2 -H "X-aws-ec2-metadata-token: $tok" "$imds/latest/meta-data/$1"
} 2>/dev/null

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

wait_runtime() {
n=0
until runtime_up; do
n=$((n + 1))
[ "$n" -ge "$runtime_timeout" ] && return 1
[ "$n" -eq 1 ] && log "container runtime not answering; waiting up to ${runtime_timeout}s"
nap 1
done
}

inspect() {
out=$("$REAPER_CLI" container inspect --format "$fmt" "$1" 2>/dev/null) || return 1
IFS='|' read -r st_status st_code st_oom st_started st_finished st_id st_error <<EOF
$out
EOF
case $st_code in -1 | [0-9] | [0-9][0-9] | [0-9][0-9][0-9]) ;; *) st_code=-1 ;; esac
[ "$st_oom" = true ] || st_oom=false
st_started=$(printf '%s' "$st_started" | sed 's/^\([0-9-]*\) \([0-9:.]*\) +0000 UTC$/\1T\2Z/')
st_finished=$(printf '%s' "$st_finished" | sed 's/^\([0-9-]*\) \([0-9:.]*\) +0000 UTC$/\1T\2Z/')
case $st_started in 0001-* | '') st_started=$zero ;; esac
case $st_finished in 0001-* | '') st_finished=$(now) ;; esac
return 0
}

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
case $st_status in running | paused | restarting) return 0 ;; esac
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

await() {
while :; do
if w=$("$REAPER_CLI" wait "$cid" 2>/dev/null); then
:
else
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
int "$w" || w=-1
x_code=$w x_oom=false x_started=$zero x_finished=$(now)
err="container $cid vanished before its state could be read"
return 0
fi
rr=true
wait_runtime || return 2
done
}

emit() {
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
record=$line
[ -n "$REAPER_EXIT_TOKEN" ] && record="${line%\}},\"token\":$(json_str "$REAPER_EXIT_TOKEN")}"
mkdir -p "${REAPER_EXIT_LOG%/*}"
s0=$(size "$REAPER_EXIT_LOG")
v0=$(agent_offset) || v0=0
if ! printf '%s\n' "$record" >>"$REAPER_EXIT_LOG"; then
log "cannot append to $REAPER_EXIT_LOG"
elif [ "$1" = false ] && [ "$REAPER_SHUTDOWN_MODE" = when-shipped ]; then
if [ "$v0" -gt "$s0" ]; then
log "agent offset $v0 is past the end of $REAPER_EXIT_LOG ($s0 bytes): stale, not waiting for it"
else
ship_end=$(size "$REAPER_EXIT_LOG")
[ "$ship_end" -gt "$s0" ] || ship_end=
fi
fi
log "exit line: $line"
}

said() { grep -qF "$1" "$REAPER_EXIT_LOG" 2>/dev/null; }

shipping() {
ship_end=$(size "$REAPER_EXIT_LOG")
v0=$(agent_offset) || v0=0
[ "$REAPER_SHUTDOWN_MODE" = when-shipped ] && [ "$ship_end" -gt 0 ] && [ "$v0" -le "$ship_end" ] || ship_end=
}

reap_host() {
if [ "$REAPER_SHUTDOWN_MODE" = when-pod-written ]; then
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
agent_state=$agent_dir/$(printf '%s' "$REAPER_EXIT_LOG" | tr '/ :' '___')
if [ -z "$REAPER_CONTAINER" ] || [ -z "$REAPER_IMAGE" ] || [ -z "$REAPER_POD_JSON" ]; then
log "$conf lacks REAPER_CONTAINER, REAPER_IMAGE or REAPER_POD_JSON"
reap_host
fi
if [ -e "$state/terminal" ]; then
log "workload already terminal before this start"
shipping
reap_host
fi
restarts=$(cat "$state/restarts" 2>/dev/null) || restarts=0
int "$restarts" || restarts=0
backoff=10
iid=
tries=0
until instance_id || [ "$tries" -ge 5 ]; do
tries=$((tries + 1))
nap 1
done
if [ "$restarts" -gt 0 ] && wait_runtime && inspect "reaper-$REAPER_CONTAINER-$((restarts - 1))"; then
restarts=$((restarts - 1))
fi

while :; do
name=reaper-$REAPER_CONTAINER-$restarts
err='' rr=false cid='' fatal=''
if ! wait_runtime; then
fatal="container runtime did not answer for ${runtime_timeout}s"
elif inspect "$name"; then
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
echo $((restarts + 1)) >"$state/restarts"
if [ "$will" = false ]; then
if [ -n "$told" ]; then shipping; else emit false; fi
: >"$state/terminal"
reap_host
fi

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
REAPER_EOF
chmod 0755 "$root/usr/local/bin/reaper-wrapper"

# The Pod and the launch's exit token, for the wrapper, and the container's
# environment: root only (0600).
umask 077
cat >"$root/etc/reaper/workload.conf" <<'REAPER_EOF'
# Reaper workload for Pod web/server, read by /usr/local/bin/reaper-wrapper.
# shellcheck shell=sh disable=SC2034,SC1003,SC2016
REAPER_POD_NAMESPACE='web'
REAPER_POD_NAME='server'
REAPER_POD_UID='11111111-2222-4333-8444-555555555555'
REAPER_CONTAINER='nginx'
REAPER_IMAGE='docker.io/library/nginx:1.27'
REAPER_RESTART_POLICY='Always'
REAPER_MAX_RESTARTS=0
REAPER_SHUTDOWN_MODE='when-shipped'
REAPER_POD_WRITTEN_TAG=''
REAPER_SHUTDOWN_DELAY=600
REAPER_EXIT_LOG='/var/log/reaper/exit.log'
REAPER_CLI='podman'
REAPER_POD_JSON='"podNamespace":"web","podName":"server","podUID":"11111111-2222-4333-8444-555555555555","container":"nginx"'
REAPER_EXIT_TOKEN=''
# Arguments of "run -d --name NAME", as shell words.
REAPER_RUN_ARGS='--label reaper.io/pod-namespace=web --label reaper.io/pod-name=server --label reaper.io/pod-uid=11111111-2222-4333-8444-555555555555 --label reaper.io/container=nginx docker.io/library/nginx:1.27'
REAPER_EOF
umask 022

cat >"$root/etc/systemd/system/reaper-workload.service" <<'REAPER_EOF'
[Unit]
Description=Reaper workload supervisor (runs the Pod's container, reports its exits)
Wants=network-online.target
After=network-online.target amazon-cloudwatch-agent.service

[Service]
Type=simple
Environment=HOME=/root
ExecStart=/usr/local/bin/reaper-wrapper /etc/reaper/workload.conf
Restart=on-failure
RestartSec=5
OOMScoreAdjust=-900

[Install]
WantedBy=multi-user.target
REAPER_EOF

cat >"$root/opt/aws/amazon-cloudwatch-agent/etc/reaper-exits.json" <<'REAPER_EOF'
{
  "logs": {
    "logs_collected": {
      "files": {
        "collect_list": [
          {
            "file_path": "/var/log/reaper/exit.log",
            "log_group_name": "/reaper/prod-eu-1/exits",
            "log_stream_name": "{instance_id}"
          }
        ]
      }
    },
    "force_flush_interval": 1
  }
}
REAPER_EOF
touch "$root/var/log/reaper/exit.log"
chmod 0644 "$root/var/log/reaper/exit.log"

# Ship the exit log. The agent comes with the AMI, or from the distribution.
ctl=$(command -v amazon-cloudwatch-agent-ctl || echo /opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl)
if [ ! -x "$ctl" ]; then
	if command -v dnf >/dev/null 2>&1; then dnf install -y amazon-cloudwatch-agent; else yum install -y amazon-cloudwatch-agent; fi
fi
"$ctl" -a append-config -m ec2 -s -c "file:$root/opt/aws/amazon-cloudwatch-agent/etc/reaper-exits.json"

systemctl daemon-reload
systemctl enable reaper-workload.service
systemctl start --no-block reaper-workload.service

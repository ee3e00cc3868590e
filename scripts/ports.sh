# Sourced by the benchmark scripts (bench-etcd.sh, profile-ycsb.sh).
#
# ports_free NAME PORT... returns when nothing listens on any PORT of
# 127.0.0.1; otherwise it says which ports are taken on stderr, naming the
# script NAME, and exits the script with status 2. A server the script
# starts on a taken port exits at once, and the script would fail later
# with a message that does not name the cause (another cluster left
# running, say). It connects with bash's /dev/tcp, so it needs no tool.
ports_free() {
  local name=$1 port taken=()
  shift
  for port in "$@"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      taken+=("$port")
    fi
  done
  if [ "${#taken[@]}" -gt 0 ]; then
    echo "$name: 127.0.0.1 port(s) ${taken[*]} already in use (another cluster or benchmark still running?); stop it and run again" >&2
    exit 2
  fi
}

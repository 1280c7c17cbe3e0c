#!/usr/bin/env bash
# The host settings a real node's kubelet changes on this machine, as every kubelet does at
# start (it would refuse to start under `protectKernelDefaults` otherwise): saved before the
# nodes start and put back when they are gone, by hack/demo.sh and hack/test.sh.
#
#   hack/host-settings.sh save FILE      # prints what the kubelets will set
#   hack/host-settings.sh restore FILE   # puts the saved values back
set -euo pipefail
settings=(vm/overcommit_memory kernel/panic kernel/panic_on_oops)
kubelet_values=(1 10 1)
case "${1:-}" in
  save)
    : >"$2"
    for i in "${!settings[@]}"; do
      echo "${settings[$i]} $(cat "/proc/sys/${settings[$i]}")" >>"$2"
      printf '   %s: %s now, %s while a kubelet runs; put back on exit\n' \
        "${settings[$i]//\//.}" "$(cat "/proc/sys/${settings[$i]}")" "${kubelet_values[$i]}"
    done
    ;;
  restore)
    [ -f "$2" ] || exit 0
    while read -r setting value; do
      [ "$(cat "/proc/sys/$setting")" = "$value" ] || echo "$value" >"/proc/sys/$setting"
    done <"$2"
    rm -f "$2"
    ;;
  *) echo "usage: $0 save|restore FILE" >&2; exit 2 ;;
esac

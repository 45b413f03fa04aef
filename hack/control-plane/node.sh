# shellcheck shell=bash
# The real node of the local control plane: a kubelet, kube-proxy and
# containerd on this machine, joined to the plane. Sourced by
# hack/control-plane/control-plane (which defines log, die, start, stop_one,
# pid_alive, wait_for, kubectl_admin, write_kubeconfig, STATE, BIN, HERE);
# see docs/control-plane.md, "A real node".
#
# `up` starts it when KO_REAL_NODE=1 (or `up --real-node`); `down` stops it
# before the plane; `node-up` / `node-down` start and stop it alone on a
# plane started with it. What it changes on the machine, and undoes in
# `node-down`:
#
# - processes: containerd, the kubelet, kube-proxy, one containerd-shim per
#   Pod, the Pods' processes;
# - mounts: all under $STATE/node (the kubelet's root directory, Pod volumes,
#   container root filesystems, network namespaces);
# - network: the bridge ko-cni0 (10.245.0.1/24) and a veth per Pod;
#   kube-proxy's and the kubelet's iptables chains (KUBE-*);
# - sysctls: the kubelet's six (vm.overcommit_memory, vm.panic_on_oom,
#   kernel.panic, kernel.panic_on_oops, kernel.keys.root_maxkeys,
#   kernel.keys.root_maxbytes) and net.ipv4.ip_forward (the CNI bridge plugin
#   turns it on), saved before and restored after;
# - cgroups: /sys/fs/cgroup/*/kubepods;
# - files outside $STATE that containerd and the kubelet insist on
#   (/run/containerd for the shims' sockets, /var/lib/cni for CNI's cache,
#   /var/log/containers): removed if they did not exist before;
# - the Node object and two ClusterRoleBindings (the node's rights, the API
#   server's rights on the kubelet).

NODE_NAME="${KO_REAL_NODE_NAME:-real-node}"
NODE_COMPONENTS=(containerd kubelet kube-proxy)
NODE="$STATE/node"
# The node's Pod network: one bridge, addresses from host-local. Apart from
# kwok's (10.244.0.0/16, addresses on paper) and podman's (10.88.0.0/16).
NODE_POD_CIDR=10.245.0.0/24
NODE_BRIDGE=ko-cni0
CNI_BIN=/usr/lib/cni
NODE_PACKAGES=(containerd runc containernetworking-plugins iptables conntrack)
# What the kubelet sets (setupKernelTunables) and what the CNI bridge plugin
# sets for its gateway; saved at node-up, restored at node-down.
NODE_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward)
# Paths outside $STATE that containerd, CNI and the kubelet create whatever
# their configuration says: removed at node-down when they were not there
# before node-up.
NODE_HOST_PATHS=(/run/containerd /var/lib/cni /var/log/containers /var/log/pods
  /run/netns /var/lib/kubelet /var/lib/containerd /opt/containerd /etc/cni /opt/cni
  /usr/libexec/kubernetes /etc/kubernetes)
# The taint and label that keep every Pod off the node except those whose
# namespace asks for it (docs/control-plane.md, "A real node").
NODE_TAINT_KEY="type"
NODE_TAINT_VALUE="real"
PAUSE_SRC="$HERE/pause"

real_node_wanted() { [[ "${KO_REAL_NODE:-}" == 1 ]]; }
# The plane was started for a real node (its API server reachable from Pods).
plane_is_real() { [[ -s "$STATE/real-node-ip" ]]; }
node_ip() { cat "$STATE/real-node-ip"; }

# The machine's address Pods and the API server use for the node: the
# source address of the default route (KO_NODE_IP overrides).
detect_node_ip() {
  if [[ -n "${KO_NODE_IP:-}" ]]; then
    echo "$KO_NODE_IP"
    return 0
  fi
  local ip
  ip="$(ip -4 -o route get 192.0.2.255 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')"
  [[ -n "$ip" && "$ip" != 127.* ]] ||
    die "a real node needs an IPv4 address that is not loopback (no default route found); set KO_NODE_IP"
  echo "$ip"
}

ctr_node() { ctr --address "$NODE/containerd.sock" --namespace k8s.io "$@"; }

pause_tag() { cat "$PAUSE_SRC/go.mod" "$PAUSE_SRC/main.go" | sha256sum | cut -c1-12; }
pause_bin() { echo "$CACHE_ROOT/control-plane/pause-$(pause_tag)/pause"; }
pause_image() { echo "localhost/kustomize-operator-pause:$(pause_tag)"; }

# containerd, runc, the CNI plugins, iptables and conntrack (kube-proxy) from
# apt when missing (root needed).
ensure_node_packages() {
  local missing=0 c
  for c in containerd runc ctr iptables ip6tables conntrack; do
    command -v "$c" >/dev/null 2>&1 || missing=1
  done
  [[ -x "$CNI_BIN/bridge" && -x "$CNI_BIN/host-local" && -x "$CNI_BIN/loopback" ]] || missing=1
  [[ $missing -eq 1 ]] || return 0
  [[ $EUID -eq 0 ]] || die "a real node needs ${NODE_PACKAGES[*]}; install them (sudo apt-get install ${NODE_PACKAGES[*]}) and retry"
  log "installing ${NODE_PACKAGES[*]} (apt)"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${NODE_PACKAGES[@]}" >&2
}

# The pause program, static, cached by the hash of its source.
build_pause() {
  local out
  out="$(pause_bin)"
  [[ -x "$out" ]] && return 0
  require_go
  log "building the Pod sandbox program (hack/control-plane/pause)"
  mkdir -p "$(dirname "$out")"
  (cd "$PAUSE_SRC" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out.tmp" .)
  mv -f "$out.tmp" "$out"
}

# A one-layer OCI image layout holding the pause program, as a tar that
# `ctr images import` reads (the name in the index's annotation).
write_pause_image() { # <tar>
  local work layer config manifest
  work="$(mktemp -d)"
  mkdir -p "$work/root" "$work/oci/blobs/sha256"
  cp "$(pause_bin)" "$work/root/pause"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work/root" -cf "$work/layer.tar" pause
  digest_of() { sha256sum "$1" | cut -d' ' -f1; }
  size_of() { stat -c %s "$1"; }
  layer="$(digest_of "$work/layer.tar")"
  cp "$work/layer.tar" "$work/oci/blobs/sha256/$layer"
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"],"User":"65535:65535"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$layer" >"$work/config.json"
  config="$(digest_of "$work/config.json")"
  cp "$work/config.json" "$work/oci/blobs/sha256/$config"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$config" "$(size_of "$work/config.json")" "$layer" "$(size_of "$work/layer.tar")" >"$work/manifest.json"
  manifest="$(digest_of "$work/manifest.json")"
  cp "$work/manifest.json" "$work/oci/blobs/sha256/$manifest"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest" "$(size_of "$work/manifest.json")" "$(pause_image)" "$(pause_tag)" >"$work/oci/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$work/oci/oci-layout"
  tar -C "$work/oci" -cf "$1" .
  rm -rf "$work"
}

# The name the kubelet asks containerd for: Kubernetes' normalization of an
# image reference (kustomize-operator:dev is docker.io/library/kustomize-operator:dev).
normalized_image() { # <image>
  local ref="$1" first="${1%%/*}"
  if [[ "$ref" != */* ]]; then
    ref="docker.io/library/$ref"
  elif [[ "$first" != *.* && "$first" != *:* && "$first" != localhost ]]; then
    ref="docker.io/$ref"
  fi
  [[ "${ref##*/}" == *[:@]* ]] || ref+=":latest"
  echo "$ref"
}

# Saves <image> from hack/podman's storage as an OCI archive and imports it
# into the node's containerd under the name Kubernetes will ask for, so that
# a Pod with imagePullPolicy IfNotPresent (or Never) runs it: no registry.
cmd_load_image() { # <image>...
  [[ $# -gt 0 ]] || die "usage: load-image IMAGE..."
  pid_alive containerd || die "the real node is not running; start it with KO_REAL_NODE=1 $0 up"
  local image tar imported wanted
  for image in "$@"; do
    tar="$(mktemp "${TMPDIR:-/tmp}/ko-load-image.XXXXXX")"
    "$HERE/../podman" save --quiet --format oci-archive -o "$tar" "$image" ||
      { rm -f "$tar"; die "hack/podman save $image failed (build it with hack/image)"; }
    imported="$(ctr_node images import --no-unpack=false "$tar" 2>&1)" ||
      { rm -f "$tar"; die "ctr images import failed: $imported"; }
    rm -f "$tar"
    # podman names the archive's image localhost/NAME:TAG (or the ref it has).
    local from
    from="$(awk '/^unpacking / { print $2; exit }' <<<"$imported")"
    wanted="$(normalized_image "$image")"
    if [[ -n "$from" && "$from" != "$wanted" ]]; then
      ctr_node images tag --force "$from" "$wanted" >/dev/null
      ctr_node images rm "$from" >/dev/null
    fi
    ctr_node images check "name==$wanted" | grep -q complete ||
      die "$wanted is not complete in the node's containerd after the import: $imported"
    log "loaded $image into the real node as $wanted"
  done
}

sysctl_path() { echo "/proc/sys/${1//.//}"; }

# One Pod network: a bridge with the gateway address, host-local addresses.
write_cni_config() {
  mkdir -p "$NODE/cni/net.d" "$NODE/cni/ipam"
  cat >"$NODE/cni/net.d/10-ko.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "ko-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$NODE_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$NODE/cni/ipam",
        "ranges": [[{"subnet": "$NODE_POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "loopback"}
  ]
}
EOF
}

write_containerd_config() {
  mkdir -p "$NODE/containerd"
  cat >"$NODE/containerd.toml" <<EOF
# Written by hack/control-plane/control-plane node-up.
version = 2
root = "$NODE/containerd/root"
state = "$NODE/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$NODE/containerd.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "$NODE/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$(pause_image)"
  # Root on this kind of machine may lack CAP_SYS_RESOURCE: a negative
  # oom_score_adj (the kubelet asks -998 for a sandbox) makes runc fail.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$NODE/cni/net.d"
EOF
}

write_kubelet_config() {
  cat >"$NODE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The node's address only: 127.0.0.1:10250 stays closed, as kwok's fake
# nodes (whose address is 127.0.0.1) need for logs and exec to fail.
address: $(node_ip)
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $STATE/pki/kubelet-serving.crt
tlsPrivateKeyFile: $STATE/pki/kubelet-serving.key
# Only the API server (its kubelet client certificate) and holders of a
# token with the rights may use the kubelet's API.
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $STATE/pki/ca.crt}
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$NODE/containerd.sock
cgroupDriver: cgroupfs
# This kind of machine mounts cgroup v1 and has swap settings of its own.
failCgroupV1: false
failSwapOn: false
podLogsDir: $NODE/pod-logs
volumePluginDir: $NODE/volume-plugins
clusterDomain: cluster.local
registerNode: true
registerWithTaints:
  - {key: $NODE_TAINT_KEY, value: $NODE_TAINT_VALUE, effect: NoSchedule}
maxPods: 30
# Images come from load-image, with no registry to pull them again: never
# collected. Eviction (and the disk-pressure taint that keeps every Pod
# off the node) only when the machine is nearly full, in absolute sizes: a
# percentage of a large disk is gigabytes, and a build beside the tests
# (a fresh clone's target directory) once took the disk under 2% of 252G
# and left every Pod of the real-node tests Unschedulable.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 256Mi
  imagefs.available: 256Mi
  nodefs.inodesFree: "1%"
EOF
}

write_kube_proxy_config() { # <healthz port> <metrics port>
  cat >"$NODE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $NODE/kube-proxy.kubeconfig
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $NODE_POD_CIDR
healthzBindAddress: 127.0.0.1:$1
metricsBindAddress: 127.0.0.1:$2
# No sysctl changes: conntrack sizes and timeouts as the machine has them,
# and no route_localnet (NodePorts on 127.0.0.1).
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
iptables:
  localhostNodePorts: false
EOF
}

# The node's certificates, signed by the plane's CA: its client identity
# (system:node:<name> in system:nodes), its serving certificate (the API
# server checks it, for logs, exec and port-forward), kube-proxy's identity.
node_pki() {
  (
    cd "$STATE/pki" || exit
    local key=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1)
    sign() { # <name> <subject> <extfile>
      openssl req "${key[@]}" -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -out "$1.crt" -extfile "$3" 2>/dev/null
      rm -f "$1.csr"
    }
    printf 'subjectAltName=IP:%s,DNS:%s\nextendedKeyUsage=serverAuth\n' "$(node_ip)" "$NODE_NAME" >kubelet-serving.ext
    sign kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" client.ext
    sign kubelet-serving "/CN=$NODE_NAME" kubelet-serving.ext
    sign kube-proxy "/CN=system:kube-proxy" client.ext
  )
}

# The plane authorizes with RBAC only (no Node authorizer): the node's
# group gets the system:node role; the API server's kubelet client may use
# the kubelet's API (logs, exec, port-forward). kube-proxy's user is bound
# by the bootstrap policy (system:node-proxier).
node_rbac() {
  kubectl_admin apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kustomize-operator:real-node
  labels: {kustomize-operator.io/real-node: "true"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:node"}
subjects:
  - {apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:nodes"}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kustomize-operator:apiserver-kubelet
  labels: {kustomize-operator.io/real-node: "true"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:kubelet-api-admin"}
subjects:
  - {apiGroup: rbac.authorization.k8s.io, kind: User, name: kube-apiserver-kubelet-client}
EOF
}

node_ready() {
  [[ "$(kubectl_admin get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

# The node's taints other than its own (disk or memory pressure, not-ready):
# any of them keeps every Pod of the tests off the node.
node_other_taints() {
  kubectl_admin get node "$NODE_NAME" -o jsonpath='{range .spec.taints[*]}{.key}{"\n"}{end}' 2>/dev/null |
    grep -vx "$NODE_TAINT_KEY" || true
}
node_schedulable() { [[ -z "$(node_other_taints)" ]]; }

cmd_node_up() {
  plane_is_real || die "the plane was not started for a real node (its API server is on loopback only); restart it with KO_REAL_NODE=1 $0 up"
  pid_alive kube-apiserver || die "the control plane is not running; run KO_REAL_NODE=1 $0 up"
  [[ $EUID -eq 0 ]] || die "a real node needs root (containerd, the kubelet's mounts and cgroups, iptables)"
  local c
  for c in "${NODE_COMPONENTS[@]}"; do
    if pid_alive "$c"; then
      if node_ready; then log "the real node $NODE_NAME is up"; return 0; fi
      log "$c runs but the node is not Ready: starting it afresh"
      cmd_node_down
      break
    fi
  done
  # Another plane's real node on this machine (its kubelet port, its cgroups).
  if ss -Hltn "sport = :10250" 2>/dev/null | grep -q .; then
    die "port 10250 is taken: another real node (or kubelet) runs on this machine; only one can"
  fi
  ensure_node_packages
  KO_REAL_NODE=1 cmd_build
  local start=$SECONDS
  mkdir -p "$NODE" "$STATE/node-saved"
  # What node-down restores: the sysctls, and which host paths existed.
  : >"$STATE/node-saved/sysctls"
  for c in "${NODE_SYSCTLS[@]}"; do
    echo "$c $(cat "$(sysctl_path "$c")")" >>"$STATE/node-saved/sysctls"
  done
  : >"$STATE/node-saved/created-paths"
  for c in "${NODE_HOST_PATHS[@]}"; do
    [[ -e "$c" || -L "$c" ]] || echo "$c" >>"$STATE/node-saved/created-paths"
  done

  node_pki
  node_rbac
  write_kubeconfig "$NODE/kubelet.kubeconfig" "$(cat "$STATE/apiserver.port")" kubelet
  write_kubeconfig "$NODE/kube-proxy.kubeconfig" "$(cat "$STATE/apiserver.port")" kube-proxy
  write_cni_config
  write_containerd_config
  write_kubelet_config
  local healthz_port metrics_port
  { read -r healthz_port && read -r metrics_port; } < <(free_ports 2)
  write_kube_proxy_config "$healthz_port" "$metrics_port"

  log "starting containerd ($NODE/containerd.sock)"
  start containerd --config "$NODE/containerd.toml" --log-level warn
  wait_for containerd 30 ctr_node version
  local tar
  tar="$(mktemp "${TMPDIR:-/tmp}/ko-pause.XXXXXX")"
  write_pause_image "$tar"
  ctr_node images import "$tar" >/dev/null
  rm -f "$tar"

  log "starting the kubelet (node $NODE_NAME at $(node_ip))"
  start kubelet --config="$NODE/kubelet.yaml" --kubeconfig="$NODE/kubelet.kubeconfig" \
    --root-dir="$NODE/kubelet" --cert-dir="$NODE/kubelet/pki" \
    --hostname-override="$NODE_NAME" --node-ip="$(node_ip)" \
    --node-labels="$NODE_TAINT_KEY=$NODE_TAINT_VALUE,kustomize-operator.io/real-node=true" --v=1
  wait_for "the real node $NODE_NAME Ready" 90 node_ready
  local deadline=$((SECONDS + 30))
  until node_schedulable || ((SECONDS >= deadline)); do sleep 1; done
  if ! node_schedulable; then
    die "the real node $NODE_NAME is Ready but tainted $(node_other_taints | paste -sd, -) (free on /: $(df -h --output=avail / | tail -1 | tr -d ' ')): no Pod of the tests would run on it"
  fi

  log "starting kube-proxy"
  start kube-proxy --config="$NODE/kube-proxy.yaml" --v=1
  wait_for kube-proxy 60 curl -fsS --max-time 5 "http://127.0.0.1:$healthz_port/healthz" -o /dev/null
  log "real node $NODE_NAME up in $((SECONDS - start))s (containerd $(containerd --version | awk '{print $3}'), kubelet and kube-proxy $K8S_VERSION)"
}

# Everything mounted at or under <dir>, deepest first.
mounts_under() { # <dir>
  awk -v d="$1" '{ p = $5; gsub(/\\040/, " ", p); if (p == d || index(p, d "/") == 1) print p }' /proc/self/mountinfo |
    awk '{ print length($0) " " $0 }' | sort -rn | cut -d' ' -f2-
}

unmount_under() { # <dir>
  local m
  while IFS= read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done < <(mounts_under "$1")
}

# Removes the chains named KUBE-* (kube-proxy's leftovers, the kubelet's
# canaries) from every table, with the rules that jump to them.
remove_kube_chains() { # <iptables command>
  local ipt="$1" table rule chain
  command -v "$ipt" >/dev/null 2>&1 || return 0
  for table in filter nat mangle raw; do
    "$ipt" -t "$table" -S >/dev/null 2>&1 || continue
    while IFS= read -r rule; do
      # shellcheck disable=SC2086 # a rule as iptables -S prints it
      eval "$ipt -t $table ${rule/-A /-D }" 2>/dev/null || true
    done < <("$ipt" -t "$table" -S | grep -E '^-A ' | grep -E -- '-j (KUBE|CNI)-|^-A (KUBE|CNI)-' | grep -vE '^-A (KUBE|CNI)-' || true)
    while IFS= read -r chain; do
      "$ipt" -t "$table" -F "$chain" 2>/dev/null || true
    done < <("$ipt" -t "$table" -S | awk '$1 == "-N" && $2 ~ /^(KUBE|CNI)-/ { print $2 }')
    while IFS= read -r chain; do
      "$ipt" -t "$table" -X "$chain" 2>/dev/null || true
    done < <("$ipt" -t "$table" -S | awk '$1 == "-N" && $2 ~ /^(KUBE|CNI)-/ { print $2 }')
  done
}

# Stops the real node and undoes what it changed on the machine, in the
# order that leaves nothing behind: its Pods deleted while the kubelet runs
# (so their networks are torn down by CNI), the kubelet and kube-proxy
# stopped, leftover containers killed, containerd stopped, mounts, bridge,
# iptables chains, cgroups, sysctls and created paths undone, the Node
# object deleted.
cmd_node_down() {
  local api=0 c
  pid_alive kube-apiserver && is_ready && api=1
  if [[ $api -eq 1 ]] && kubectl_admin get node "$NODE_NAME" >/dev/null 2>&1; then
    kubectl_admin cordon "$NODE_NAME" >/dev/null 2>&1 || true
    if pid_alive kubelet; then
      # Grace periods are capped: a Pod whose process ignores SIGTERM holds
      # this up for at most 30 s.
      kubectl_admin delete pods --all-namespaces --field-selector "spec.nodeName=$NODE_NAME" \
        --grace-period=30 --timeout=60s --wait=true >/dev/null 2>&1 || true
    fi
  fi
  for c in kube-proxy kubelet; do stop_one "$c"; done
  if [[ -x "$BIN/kube-proxy" && -f "$NODE/kube-proxy.yaml" ]]; then
    "$BIN/kube-proxy" --cleanup --config="$NODE/kube-proxy.yaml" >>"$STATE/logs/kube-proxy.log" 2>&1 || true
  fi
  if pid_alive containerd; then
    local id
    for id in $(ctr_node tasks ls -q 2>/dev/null); do
      ctr_node tasks kill --signal SIGKILL "$id" >/dev/null 2>&1 || true
    done
    for id in $(ctr_node tasks ls -q 2>/dev/null); do
      ctr_node tasks delete --force "$id" >/dev/null 2>&1 || true
    done
    stop_one containerd
  fi
  # Shims whose containerd is gone (they exit with their tasks, normally).
  local pid
  for pid in $(pgrep -f "containerd-shim-runc-v2 -namespace k8s.io -address $NODE/containerd.sock" || true); do
    kill -KILL "$pid" 2>/dev/null || true
  done
  # Network: veths left on the bridge, then the bridge.
  if ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then
    local veth
    for veth in $(ip -o link show master "$NODE_BRIDGE" 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }'); do
      ip link delete "$veth" 2>/dev/null || true
    done
    ip link delete "$NODE_BRIDGE" 2>/dev/null || true
  fi
  remove_kube_chains iptables
  remove_kube_chains ip6tables
  [[ ! -d "$NODE" ]] || unmount_under "$NODE"
  # cgroups the kubelet made, leaves first.
  local dir
  for dir in /sys/fs/cgroup/*/kubepods; do
    [[ -d "$dir" ]] || continue
    find "$dir" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  if [[ -f "$STATE/node-saved/sysctls" ]]; then
    local key value
    while read -r key value; do
      [[ "$(cat "$(sysctl_path "$key")")" == "$value" ]] || echo "$value" >"$(sysctl_path "$key")" || log "could not restore $key to $value"
    done <"$STATE/node-saved/sysctls"
  fi
  if [[ -f "$STATE/node-saved/created-paths" ]]; then
    local path
    while IFS= read -r path; do
      [[ -n "$path" && -e "$path" ]] || continue
      unmount_under "$path"
      [[ -z "$(mounts_under "$path")" ]] && rm -rf "$path"
    done <"$STATE/node-saved/created-paths"
  fi
  if [[ $api -eq 1 ]]; then
    kubectl_admin delete node "$NODE_NAME" --ignore-not-found >/dev/null 2>&1 || true
    kubectl_admin delete clusterrolebinding -l kustomize-operator.io/real-node=true --ignore-not-found >/dev/null 2>&1 || true
  fi
  if [[ -d "$NODE" ]]; then
    [[ -z "$(mounts_under "$NODE")" ]] || die "mounts remain under $NODE: $(mounts_under "$NODE" | paste -sd' ')"
    rm -rf "$NODE"
  fi
  rm -rf "$STATE/node-saved"
  log "real node $NODE_NAME down"
}

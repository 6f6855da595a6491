# Sourced by scripts/train.sh and scripts/test.sh (the README's two commands):
#
#   source scripts/setup.sh && pywgtrain_setup train|test
#
# Prepares this machine and installs pywgtrain with the given extra into
# .venv at the root of the checkout:
#   1. Linux without a Vulkan driver (no ICD JSON under /usr/share/vulkan/icd.d,
#      /etc/vulkan/icd.d or /usr/local/share/vulkan/icd.d): installs Mesa's
#      drivers, whose lavapipe is a Vulkan device on the CPU, with apt-get,
#      dnf or pacman (through sudo when not root). A machine that has a driver
#      (a GPU's, or Mesa's) is left as it is. macOS (Metal) and Windows (DX12)
#      need nothing here.
#   2. What building the extension needs and the system lacks: python3 with
#      venv, the Python headers, a C++ compiler (same package manager).
#   3. .venv with pywgtrain[<extra>]; the (C++) build is redone only when the
#      sources changed since the last install, or for an extra not yet there.
#   4. Checks that WebGPU finds an adapter; on Linux, if none works although
#      a driver is registered (e.g. only a GPU vendor's ICD, no GPU), installs
#      Mesa's drivers and checks again; otherwise prints what to install.
# PYWGTRAIN_NO_SYSTEM_PACKAGES=1 skips every system package install (steps 1,
# 2 and 4 then only report). PYTHON picks the interpreter (default python3).

PYWGTRAIN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

_pw_say() { printf '[setup] %s\n' "$*" >&2; }

_pw_has_vulkan_icd() {
  # A user-chosen driver list counts as a driver.
  [ -n "${VK_ICD_FILENAMES:-}${VK_DRIVER_FILES:-}${VK_ADD_DRIVER_FILES:-}" ] && return 0
  local d f
  # PYWGTRAIN_ICD_DIRS: where to look instead (tests/test_cli.py simulates a machine without a driver).
  for d in ${PYWGTRAIN_ICD_DIRS:-/usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d}; do
    for f in "$d"/*.json; do [ -e "$f" ] && return 0; done
  done
  return 1
}

_pw_pkg_manager() {
  local pm
  for pm in apt-get dnf pacman; do
    if command -v "$pm" >/dev/null 2>&1; then echo "$pm"; return; fi
  done
  echo none
}

# Package names per manager: driver, python, venv, headers, compiler.
_pw_packages() {
  case "$1:$2" in
    apt-get:driver) echo "mesa-vulkan-drivers libvulkan1" ;;
    apt-get:python) echo "python3" ;;
    apt-get:venv) echo "python3-venv" ;;
    apt-get:headers) echo "python3-dev" ;;
    apt-get:compiler) echo "g++" ;;
    dnf:driver) echo "mesa-vulkan-drivers vulkan-loader" ;;
    dnf:python) echo "python3" ;;
    dnf:venv) echo "" ;;
    dnf:headers) echo "python3-devel" ;;
    dnf:compiler) echo "gcc-c++" ;;
    pacman:driver) echo "vulkan-swrast vulkan-icd-loader" ;;
    pacman:python | pacman:venv | pacman:headers) echo "python" ;;
    pacman:compiler) echo "gcc" ;;
  esac
}

_pw_as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    _pw_say "need root (or sudo) to run: $*"
    return 1
  fi
}

_pw_apt_updated=""
_pw_install() {  # _pw_install <why> <packages...>
  local why=$1; shift
  [ $# -gt 0 ] || return 0
  local pm; pm=$(_pw_pkg_manager)
  if [ -n "${PYWGTRAIN_NO_SYSTEM_PACKAGES:-}" ] || [ "$pm" = none ]; then
    _pw_say "missing $why; install: $* (PYWGTRAIN_NO_SYSTEM_PACKAGES is set or no apt-get/dnf/pacman found)"
    return 1
  fi
  _pw_say "installing $why: $* ($pm)"
  case "$pm" in
    apt-get)
      if [ -z "$_pw_apt_updated" ]; then
        _pw_as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq || return 1
        _pw_apt_updated=1
      fi
      _pw_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" ;;
    dnf) _pw_as_root dnf install -y -q "$@" ;;
    pacman) _pw_as_root pacman -S --noconfirm --needed "$@" ;;
  esac
}

_pw_linux_prerequisites() {
  local pm; pm=$(_pw_pkg_manager)
  local want=() py=${PYTHON:-python3}
  if ! _pw_has_vulkan_icd; then
    _pw_say "no Vulkan driver registered (no ICD JSON in /usr/share/vulkan/icd.d, /etc/vulkan/icd.d)"
    want+=($(_pw_packages "$pm" driver))
    _pw_mesa_installed=1
  fi
  if ! command -v "$py" >/dev/null 2>&1; then
    want+=($(_pw_packages "$pm" python) $(_pw_packages "$pm" venv) $(_pw_packages "$pm" headers))
  else
    "$py" -c "import venv, ensurepip" >/dev/null 2>&1 || want+=($(_pw_packages "$pm" venv))
    "$py" -c "import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" \
      >/dev/null 2>&1 || want+=($(_pw_packages "$pm" headers))
  fi
  command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || command -v clang++ >/dev/null 2>&1 \
    || want+=($(_pw_packages "$pm" compiler))
  if [ ${#want[@]} -gt 0 ]; then
    # Unique names, order kept.
    local uniq=() p q seen
    for p in "${want[@]}"; do
      seen=""
      for q in "${uniq[@]+"${uniq[@]}"}"; do [ "$p" = "$q" ] && seen=1; done
      [ -n "$seen" ] || uniq+=("$p")
    done
    _pw_install "system packages" "${uniq[@]}" || return 1
  fi
}

_pw_source_hash() {
  # Everything the wheel is built from (not build outputs), hashed.
  (cd "$PYWGTRAIN_ROOT" && "$1" - <<'EOF'
import hashlib, os
h = hashlib.sha256()
for top in ("pyproject.toml", "CMakeLists.txt", "csrc", "shaders", "pywgtrain", "third_party", "cmake"):
    if os.path.isfile(top):
        paths = [top]
    else:
        paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(top) for f in fs)
    for p in paths:
        if "__pycache__" in p or p.endswith((".so", ".pyd", ".dylib", ".pyc", "_core.cpp")):
            continue
        h.update(p.encode() + b"\0")
        with open(p, "rb") as f:
            h.update(f.read())
print(h.hexdigest())
EOF
  )
}

_pw_check_adapter() {
  # Outside the checkout: the source tree has no compiled extension.
  (cd / && "$PYWGTRAIN_ROOT/.venv/bin/python" -c "import sys, pywgtrain; sys.exit(0 if pywgtrain.list_adapters() else 3)")
}

pywgtrain_setup() {
  local extra=${1:?usage: pywgtrain_setup train|test}
  local py=${PYTHON:-python3}
  local venv="$PYWGTRAIN_ROOT/.venv"
  _pw_mesa_installed=""
  case "$(uname -s)" in
    Linux) _pw_linux_prerequisites || return 1 ;;
    Darwin) command -v c++ >/dev/null 2>&1 || { _pw_say "no C++ compiler: run xcode-select --install"; return 1; } ;;
  esac
  if ! command -v "$py" >/dev/null 2>&1; then
    _pw_say "$py not found: install Python 3.9 or newer (or set PYTHON)"
    return 1
  fi
  if [ ! -x "$venv/bin/python" ]; then
    _pw_say "creating $venv"
    rm -rf "$venv"
    "$py" -m venv "$venv" || return 1
  fi
  local hash stamp="$venv/.pywgtrain-installed"
  hash=$(_pw_source_hash "$venv/bin/python") || return 1
  local have=""
  [ -f "$stamp" ] && have=$(cat "$stamp")
  # The test extra includes everything the train extra has.
  if [ "$have" = "$hash $extra" ] || { [ "$extra" = train ] && [ "$have" = "$hash test" ]; }; then
    _pw_say "pywgtrain[$extra] already installed in $venv from these sources"
  else
    _pw_say "building pywgtrain (C++ core and extension, a minute or two) and installing pywgtrain[$extra] into $venv"
    rm -f "$stamp"
    (cd "$PYWGTRAIN_ROOT" && "$venv/bin/pip" install -q ".[$extra]") || return 1
    echo "$hash $extra" > "$stamp"
  fi
  local rc=0
  _pw_check_adapter || rc=$?
  if [ "$rc" -eq 3 ] && [ "$(uname -s)" = Linux ] && [ -z "$_pw_mesa_installed" ]; then
    _pw_say "a Vulkan driver is registered but WebGPU finds no adapter with it; adding Mesa's (lavapipe)"
    if _pw_install "a Vulkan driver" $(_pw_packages "$(_pw_pkg_manager)" driver); then
      rc=0
      _pw_check_adapter || rc=$?
    fi
  fi
  if [ "$rc" -ne 0 ]; then
    _pw_say "pywgtrain cannot use a GPU on this machine yet:"
    "$venv/bin/pywgtrain" info || true
    return 1
  fi
}

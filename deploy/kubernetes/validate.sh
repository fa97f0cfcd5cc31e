#!/usr/bin/env bash
# Validates the manifests in this directory against the Kubernetes API schemas
# (kubernetes-validate from PyPI, strict: unknown fields are errors) for the oldest and
# the newest Kubernetes this deployment is meant for, and checks that kustomization.yaml
# lists every manifest but the example Secret. No cluster needed. The validator lives in
# a venv under /var/cache/codecage, made once (python3-venv installed when missing).
set -euo pipefail
cd "$(dirname "$0")"
package=kubernetes-validate==1.37.0
versions=(1.29.0 1.37.0)
venv=/var/cache/codecage/kubernetes-validate
if [ "$(cat "$venv/codecage-installed" 2>/dev/null)" != "$package" ]; then
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    if ! python3 -m venv "$venv" 2>/dev/null; then
        rm -rf "$venv"
        apt-get install -y -qq python3-venv >/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null; }
        python3 -m venv "$venv"
    fi
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$package"
    echo "$package" >"$venv/codecage-installed"
fi

manifests=()
for f in *.yaml; do
    [ "$f" = kustomization.yaml ] || manifests+=("$f")
done
for version in "${versions[@]}"; do
    "$venv/bin/kubernetes-validate" --strict --quiet -k "$version" "${manifests[@]}"
done
for f in "${manifests[@]}"; do
    listed=$(grep -cx "  - $f" kustomization.yaml || true)
    case "$f" in
    *.example.yaml) [ "$listed" = 0 ] || { echo "kustomization.yaml must not apply the example $f" >&2; exit 1; } ;;
    *) [ "$listed" = 1 ] || { echo "kustomization.yaml does not list $f" >&2; exit 1; } ;;
    esac
done
echo "kubernetes manifests: ${#manifests[@]} valid for Kubernetes ${versions[*]}"

// Package release holds no code: its test runs scripts/release.sh, which
// builds postbox's release binaries, and checks what it builds (every
// target cross-compiles, static, stamped, the same bytes twice).
package release

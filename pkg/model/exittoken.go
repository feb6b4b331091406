package model

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
)

// An exit token is the secret of one launch: the provider puts it in the
// host's configuration, readable by root only, and its hash on the
// instance as a launch tag (TagKeys.ExitToken); the host's wrapper adds it
// to every exit line. Only the instance's own host knows it, so a line
// carrying it comes from that host, whatever log stream it was written
// to. The token itself never goes further than the exitrecorder, which
// hands the reconciler its hash.
var (
	// exitTokenPattern bounds a token: 32 to 128 letters, digits, - and _
	// (hex or unpadded base64url), at least 128 bits when hex.
	exitTokenPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{32,128}$`)
	// exitTokenHashPattern is ExitTokenHash's form: a SHA-256 in lower-case
	// hex.
	exitTokenHashPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// ValidExitToken reports whether token has an exit token's shape: 32 to
// 128 of A-Z a-z 0-9 - _.
func ValidExitToken(token string) bool { return exitTokenPattern.MatchString(token) }

// ExitTokenHash is the value of the exit-token tag for token: its SHA-256
// in lower-case hex. A plain SHA-256 suffices: the token is random
// (userdata.NewExitToken draws 256 bits), so no search over hashes finds
// it.
func ExitTokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// ValidExitTokenHash reports whether h has ExitTokenHash's form: 64
// lower-case hexadecimal digits.
func ValidExitTokenHash(h string) bool { return exitTokenHashPattern.MatchString(h) }

// Package layout holds no code: its test pins the import rules of the
// project's layout, so that a change that breaks one fails `go test`.
package layout

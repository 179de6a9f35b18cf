// Package sealed seals interfaces of postbox's public API that only
// postbox's own types may implement, in this module but in other
// packages than the interface's (an unexported method would shut those
// out too).
//
// A sealed interface has a marker method taking a Token. A type outside
// this module cannot name Token, so it cannot declare that method; it
// can only embed one of postbox's types that has it (the approach of
// google.golang.org/protobuf's internal pragma.DoNotImplement).
package sealed

// Token is the parameter of a sealed interface's marker method.
type Token struct{}

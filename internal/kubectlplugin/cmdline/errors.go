package cmdline

import "fmt"

// UsageError is a command line that cannot be run: the caller exits with status 2 and
// points at the command's help, which is how kubectl tells a wrong command line from a
// failure.
type UsageError struct {
	// Cmd is the command whose help to point at, e.g. "archive get" ("" for the top).
	Cmd string
	// Err says what is wrong with the command line.
	Err error
}

// Error is the message, without the pointer to the help (the caller adds it).
func (e *UsageError) Error() string { return e.Err.Error() }

// Usagef is a UsageError of cmd with a formatted message: the one way commands refuse a
// command line, so that every refusal exits alike.
func Usagef(cmd, format string, args ...any) error {
	return &UsageError{Cmd: cmd, Err: fmt.Errorf(format, args...)}
}

// HelpRequested is -h or --help: the caller prints Text on stdout and exits with status
// 0, as kubectl does for help.
type HelpRequested struct {
	// Text is the help to print.
	Text string
}

// Error makes a help request travel as an error out of the parsing.
func (h *HelpRequested) Error() string { return "help requested" }

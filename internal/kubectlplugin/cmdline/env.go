package cmdline

import "io"

// Env is what a command runs with besides its arguments: where its output goes and
// the environment it reads. Getenv stands for os.Getenv, so tests choose the
// environment.
type Env struct {
	// Stdout receives the command's result.
	Stdout io.Writer
	// Stderr receives notes beside the result (the caller prints errors).
	Stderr io.Writer
	// Getenv reads an environment variable, as os.Getenv does.
	Getenv func(string) string
}

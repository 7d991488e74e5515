// Package pgtest starts a real PostgreSQL server for tests: the machine's initdb and
// postgres binaries, a data directory under a temporary directory, a free loopback
// port, stopped (and its directory removed) at the end. Tests never share a server
// with each other or with anything else on the machine.
package pgtest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Server is one running (or stopped) PostgreSQL.
type Server struct {
	dir  string
	data string
	bin  string
	Port int
}

// binDirs are where upstream builds put the server binaries (Debian's are globbed).
var binDirs = []string{"/usr/local/pgsql/bin"}

// BinDir finds initdb and postgres: $PG_BIN, then PATH, then the packages' paths.
func BinDir() (string, error) {
	if d := os.Getenv("PG_BIN"); d != "" {
		return d, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("pg_ctl"); err == nil {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Sort(sort.Reverse(sort.StringSlice(dirs))) // the newest first
	for _, d := range append(dirs, binDirs...) {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: install them (Debian: apt-get install -y postgresql) or set PG_BIN")
}

// Start initialises a cluster in a new temporary directory and starts it.
func Start() (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, data: filepath.Join(dir, "data"), bin: bin}
	// initdb refuses to run as root; CI runs as root, so the server runs as nobody
	// there (its directory handed over first).
	if err := s.run("initdb", "-D", s.data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := s.StartAgain(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// StartAgain starts a stopped server on a free port (the same one when it is free).
func (s *Server) StartAgain() error {
	if s.Port == 0 {
		p, err := freePort()
		if err != nil {
			return err
		}
		s.Port = p
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c max_connections=200", s.Port, s.dir)
	return s.run("pg_ctl", "-D", s.data, "-o", opts, "-l", filepath.Join(s.dir, "log"), "-w", "-t", "60", "start")
}

// Pid is the postmaster's process ID (from postmaster.pid), 0 when it is not running.
// The postmaster is not a child of the test: pg_ctl starts it detached.
func (s *Server) Pid() int {
	raw, err := os.ReadFile(filepath.Join(s.data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

// Stop stops the server fast (open connections are cut), keeping its data.
func (s *Server) Stop() error {
	return s.run("pg_ctl", "-D", s.data, "-m", "fast", "-w", "stop")
}

// Close stops the server and removes its directory.
func (s *Server) Close() {
	_ = s.Stop()
	_ = os.RemoveAll(s.dir)
}

// URL is a connection URL for database name (created with CreateDatabase; "postgres" always exists).
func (s *Server) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, database)
}

// CreateDatabase creates an empty database, so that tests sharing a server never share tables.
func (s *Server) CreateDatabase(name string) error {
	return s.run("createdb", "-h", "127.0.0.1", "-p", fmt.Sprint(s.Port), "-U", "postgres", name)
}

// Log is the server's log so far, for a failing test's output.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "log"))
	return string(b)
}

func (s *Server) run(name string, args ...string) error {
	path := filepath.Join(s.bin, name)
	if _, err := os.Stat(path); err != nil {
		if p, lerr := exec.LookPath(name); lerr == nil {
			path = p
		}
	}
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		// PostgreSQL will not run as root.
		if err := chownAll(s.dir, "nobody"); err != nil {
			return err
		}
		quoted := make([]string, 0, len(args)+1)
		for _, a := range append([]string{path}, args...) {
			quoted = append(quoted, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
		}
		cmd = exec.Command("su", "-s", "/bin/sh", "nobody", "-c", strings.Join(quoted, " "))
	} else {
		cmd = exec.Command(path, args...)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGTZ=UTC")
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return nil
}

func chownAll(dir, user string) error {
	out, err := exec.Command("chown", "-R", user, dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("chown %s: %w: %s", dir, err, out)
	}
	return os.Chmod(dir, 0o700)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// WaitGone waits until nothing listens on the server's port any more.
func (s *Server) WaitGone(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", s.Port), 100*time.Millisecond)
		if err != nil {
			return
		}
		_ = c.Close()
		time.Sleep(50 * time.Millisecond)
	}
}

// CopyData copies the data directory of a stopped server (Stop first) and returns the
// copy's path, inside the server's directory (removed by Close). With RestoreData it
// stands for a backup taken at that moment, restored later.
func (s *Server) CopyData() (string, error) {
	entries, _ := filepath.Glob(filepath.Join(s.dir, "copy-*"))
	dst := filepath.Join(s.dir, fmt.Sprintf("copy-%d", len(entries)+1))
	if out, err := exec.Command("cp", "-a", s.data, dst).CombinedOutput(); err != nil {
		return "", fmt.Errorf("copy the data directory: %w: %s", err, out)
	}
	return dst, nil
}

// RestoreData replaces the data directory of a stopped server with a copy CopyData
// made (the copy is kept, so it can be restored again); StartAgain then starts the
// server as it was when the copy was taken.
func (s *Server) RestoreData(copyDir string) error {
	if err := os.RemoveAll(s.data); err != nil {
		return err
	}
	if out, err := exec.Command("cp", "-a", copyDir, s.data).CombinedOutput(); err != nil {
		return fmt.Errorf("restore the data directory: %w: %s", err, out)
	}
	return nil
}

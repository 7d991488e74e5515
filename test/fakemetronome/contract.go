package fakemetronome

import (
	"net/http"
	"time"

	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
)

// The Metronome adapter looks up by key (the events search), so the adapter contract
// (test/adaptercontract) fails its reads through the fixture.
var (
	_ adaptercontract.LookupFaultFixture = (*Server)(nil)
	_ adaptercontract.WindowFixture      = (*Server)(nil)
	_ adaptercontract.ClockFixture       = (*Server)(nil)
)

// now is the fake's clock: its Options.Now, moved on by PassWindow.
func (s *Server) now() time.Time { return s.opts.Now().Add(time.Duration(s.aged.Load())) }

// Now is the clock the contract gives the adapter as well, so that both see a window pass.
func (s *Server) Now() time.Time { return s.now() }

// PassWindow moves the fake's clock (and the adapter's) an hour past Metronome's 34 days.
func (s *Server) PassWindow() { s.aged.Add(int64(Window + time.Hour)) }

// FailLookups makes the next n events searches answer Metronome's 500 {"message"}.
func (s *Server) FailLookups(n int) { s.FailSearch(http.StatusInternalServerError, n) }

// Fatal-signal reporting for the server process: on SIGSEGV, SIGBUS, SIGFPE, SIGILL or SIGABRT, write one line
// naming the signal and a raw backtrace to stderr, then die of the same signal (exit status and core dump as
// without the handler). Runs on an alternate stack, so a stack overflow is reported too.
#pragma once

namespace m3::server {

// Idempotent; call once early in main / a subcommand. Gives the calling thread an alternate signal stack.
void install_crash_handler();

// An alternate signal stack for the calling thread (each thread needs its own), so that a stack overflow there
// is reported too. The HTTP io threads call it.
void use_crash_stack_on_this_thread();

}  // namespace m3::server

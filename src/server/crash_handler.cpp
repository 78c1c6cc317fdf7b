#include "server/crash_handler.h"

#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>

namespace m3::server {

namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

// Only async-signal-safe calls below: write(2), backtrace_symbols_fd (which does not allocate), raise.
void write_str(const char* s) {
  ssize_t ignored = ::write(STDERR_FILENO, s, strlen(s));
  (void)ignored;
}

void on_fatal(int sig, siginfo_t*, void*) {
  char num[16];
  int n = 0, v = sig;
  char rev[16];
  do {
    rev[n++] = char('0' + v % 10);
    v /= 10;
  } while (v > 0 && n < 15);
  for (int i = 0; i < n; ++i) num[i] = rev[n - 1 - i];
  num[n] = '\0';
  write_str("m3serve: fatal signal ");
  write_str(num);
  write_str(" (");
  write_str(sigabbrev_np(sig) ? sigabbrev_np(sig) : "?");
  write_str("), backtrace:\n");
  void* frames[64];
  const int depth = backtrace(frames, 64);
  backtrace_symbols_fd(frames, depth, STDERR_FILENO);
  // SA_RESETHAND restored the default action: die of the same signal.
  raise(sig);
}

}  // namespace

void use_crash_stack_on_this_thread() {
  static thread_local std::unique_ptr<char[]> stack;
  if (stack) return;
  constexpr size_t kBytes = 64 * 1024;
  stack = std::make_unique<char[]>(kBytes);
  stack_t ss{};
  ss.ss_sp = stack.get();
  ss.ss_size = kBytes;
  sigaltstack(&ss, nullptr);
}

void install_crash_handler() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  // backtrace() loads libgcc on first use, which allocates: do it now, not inside the handler.
  void* warm[1];
  backtrace(warm, 1);
  use_crash_stack_on_this_thread();
  struct sigaction sa{};
  sa.sa_sigaction = on_fatal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int s : kSignals) sigaction(s, &sa, nullptr);
}

}  // namespace m3::server

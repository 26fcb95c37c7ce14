#pragma once
// The subcommands of the precompute CLI: each registers its flags on the app and returns the
// function that runs it (returning the exit code). One file per subcommand.

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace precompute {

class Error;

using CommandFn = std::function<int()>;

// The exit code a command ends with after `error` (README, "Exit codes"; main.cpp).
int exit_code_for(const Error& error);

// Whether the process runs its exit handlers when a command returns (under Address- or
// ThreadSanitizer), rather than leaving with _Exit (Note [Leaving without tearing down] in
// main.cpp).
bool tears_down_at_exit();

// `command_line`: argv as typed, which a rank of a split job records for its rerun command.
CommandFn add_run_command(CLI::App& app, std::vector<std::string> command_line);
CommandFn add_inspect_command(CLI::App& app);
CommandFn add_tokenize_command(CLI::App& app);
CommandFn add_doctor_command(CLI::App& app);
CommandFn add_verify_command(CLI::App& app);
CommandFn add_merge_command(CLI::App& app);
CommandFn add_status_command(CLI::App& app);

}  // namespace precompute

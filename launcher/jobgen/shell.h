// Quoting for the shell, shared by the job generators (`dlrun slurm`, `dlrun runai`).
#pragma once

#include <string>
#include <vector>


namespace dlrun::launcher {

// POSIX shell quoting: the word unchanged if it is safe, else in single quotes.
std::string ShellQuote(const std::string& word);
// The words quoted and joined by spaces.
std::string JoinCommand(const std::vector<std::string>& cmd);
// `bytes` random bytes as hex (tokens).
std::string RandomHex(int bytes);

}  // namespace dlrun::launcher

// A checkpoint file's layout and its atomic write (checkpoint.cc writes and reads the payload):
// 8 bytes of magic, the payload's length and its FNV-1a checksum (little-endian u64 each), then
// the payload. Internal to the worker library; no LibTorch.
#pragma once

#include <cstdint>
#include <string>

namespace dlrun::worker::detail {

// The header for `payload` followed by nothing: header + payload is the file.
std::string CheckpointHeader(const std::string& payload);
// Why a checkpoint file's bytes cannot be loaded: its magic, length and checksum (empty: none).
std::string CheckpointFileProblem(const std::string& data);
// The payload of bytes whose CheckpointFileProblem is empty.
std::string CheckpointPayload(const std::string& data);

// header + payload into `tmp`, synced, then renamed to `final_path`: a reader sees the whole
// file or none. On failure the temporary file is removed and the error thrown.
void WriteThenRename(const std::string& header, const std::string& payload, const std::string& tmp,
                     const std::string& final_path);
// Syncs the directory, so that a rename in it is durable (best effort).
void SyncDirectory(const std::string& dir);
// A file's bytes (empty when unreadable: CheckpointFileProblem then names it).
std::string ReadWholeFile(const std::string& path);

// The file name of step `step`'s checkpoint ("ckpt-000000000042.dlrun"), and the step in such a
// name (-1 for another name).
std::string CheckpointFileName(int64_t step);
int64_t StepOfCheckpointFile(const std::string& path);

}  // namespace dlrun::worker::detail

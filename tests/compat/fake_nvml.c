/* A fake NVML (libnvidia-ml) for tests on machines without a GPU: the entry points dlrun uses,
 * answering from FAKE_NVML_GPUS="used_MiB:total_MiB:util_percent,..." (one entry per GPU) and,
 * for the processes on each GPU, from the file named by FAKE_NVML_PROCS_FILE (lines
 * "gpu_index:pid:used_MiB", read at each call, so a test can add its workers as they start).
 * With FAKE_NVML_SEEN_FILE set, each call appends the pids it reported, one per line, so a
 * worker can wait until the agent has sampled it. 
 * dlrun loads it through its NVML library variable (common/contract.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

static int parse(unsigned index, unsigned long long* used, unsigned long long* total,
                 unsigned* util) {
  const char* spec = getenv("FAKE_NVML_GPUS");
  if (spec == NULL) return -1;
  unsigned i = 0;
  for (const char* p = spec; *p != '\0'; ++i) {
    unsigned long long u = 0, t = 0;
    unsigned z = 0;
    if (sscanf(p, "%llu:%llu:%u", &u, &t, &z) != 3) return -1;
    if (i == index) {
      *used = u << 20;
      *total = t << 20;
      *util = z;
      return 0;
    }
    p = strchr(p, ',');
    if (p == NULL) break;
    ++p;
  }
  return -1;
}

int nvmlInit_v2(void) { return getenv("FAKE_NVML_GPUS") ? 0 : 1; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned* n) {
  const char* spec = getenv("FAKE_NVML_GPUS");
  *n = 0;
  if (spec == NULL || *spec == '\0') return 0;
  *n = 1;
  for (const char* p = spec; (p = strchr(p, ',')) != NULL; ++p) ++*n;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void** handle) {
  *handle = (void*)(unsigned long)(i + 1);
  return 0;
}
int nvmlDeviceGetMemoryInfo(void* handle, nvmlMemory_t* m) {
  unsigned long long used, total;
  unsigned util;
  if (parse((unsigned)(unsigned long)handle - 1, &used, &total, &util) != 0) return 1;
  m->used = used;
  m->total = total;
  m->free = total - used;
  return 0;
}
int nvmlDeviceGetUtilizationRates(void* handle, nvmlUtilization_t* u) {
  unsigned long long used, total;
  unsigned util;
  if (parse((unsigned)(unsigned long)handle - 1, &used, &total, &util) != 0) return 1;
  u->gpu = util;
  u->memory = 0;
  return 0;
}

typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

int nvmlDeviceGetComputeRunningProcesses_v3(void* handle, unsigned* count, nvmlProcessInfo_t* infos) {
  const unsigned gpu = (unsigned)(unsigned long)handle - 1;
  const unsigned room = *count;
  unsigned n = 0;
  const char* path = getenv("FAKE_NVML_PROCS_FILE");
  FILE* f = path != NULL ? fopen(path, "r") : NULL;
  const char* seen_path = getenv("FAKE_NVML_SEEN_FILE");
  FILE* seen = seen_path != NULL ? fopen(seen_path, "a") : NULL;
  if (f != NULL) {
    unsigned g = 0, pid = 0;
    unsigned long long mib = 0;
    while (fscanf(f, "%u:%u:%llu", &g, &pid, &mib) == 3) {
      if (g != gpu) continue;
      if (n < room) {
        if (seen != NULL) fprintf(seen, "%u\n", pid);
        infos[n].pid = pid;
        infos[n].usedGpuMemory = mib << 20;
        infos[n].gpuInstanceId = infos[n].computeInstanceId = 0xFFFFFFFFu;
      }
      ++n;
    }
    fclose(f);
  }
  if (seen != NULL) fclose(seen);
  *count = n;
  return n <= room ? 0 : 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
}

/* Health, for the preflight: FAKE_NVML_ECC="gpu_index:uncorrected,..." (GPUs not named: 0) and
 * FAKE_NVML_REMAP_PENDING="gpu_index,..." (a row remap waiting for a reset). */
static int listed(const char* var, unsigned gpu, unsigned long long* value) {
  const char* spec = getenv(var);
  for (const char* p = spec; p != NULL && *p != '\0';) {
    unsigned i = 0;
    unsigned long long v = 1;
    if (sscanf(p, "%u:%llu", &i, &v) < 1) return 0;
    if (i == gpu) {
      *value = v;
      return 1;
    }
    p = strchr(p, ',');
    if (p != NULL) ++p;
  }
  return 0;
}
int nvmlDeviceGetTotalEccErrors(void* handle, int type, int counter, unsigned long long* count) {
  (void)type;
  (void)counter;
  *count = 0;
  listed("FAKE_NVML_ECC", (unsigned)(unsigned long)handle - 1, count);
  return 0;
}
int nvmlDeviceGetRemappedRows(void* handle, unsigned* corr, unsigned* unc, unsigned* pending,
                              unsigned* failed) {
  unsigned long long v = 0;
  *corr = *unc = *failed = 0;
  *pending = listed("FAKE_NVML_REMAP_PENDING", (unsigned)(unsigned long)handle - 1, &v) ? 1 : 0;
  return 0;
}

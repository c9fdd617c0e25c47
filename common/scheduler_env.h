// The variables dlrun reads from the schedulers and launchers it runs under, each spelled once
// (tests/launcher/contract_test.cc checks that no other source spells them). dlrun reads them,
// never sets them; docs/COMPAT.md says what each means to dlrun.
#pragma once

namespace dlrun::sched {

// Slurm (srun, sbatch)
inline constexpr char kSlurmJobId[] = "SLURM_JOB_ID";
inline constexpr char kSlurmJobNodelist[] = "SLURM_JOB_NODELIST";
inline constexpr char kSlurmJobNumNodes[] = "SLURM_JOB_NUM_NODES";
inline constexpr char kSlurmStepNodelist[] = "SLURM_STEP_NODELIST";
inline constexpr char kSlurmStepNumNodes[] = "SLURM_STEP_NUM_NODES";
inline constexpr char kSlurmProcId[] = "SLURM_PROCID";
inline constexpr char kSlurmLocalId[] = "SLURM_LOCALID";
inline constexpr char kSlurmNodeId[] = "SLURM_NODEID";
inline constexpr char kSlurmNtasks[] = "SLURM_NTASKS";
inline constexpr char kSlurmNtasksPerNode[] = "SLURM_NTASKS_PER_NODE";
inline constexpr char kSlurmRestartCount[] = "SLURM_RESTART_COUNT";
// What the job was allocated (the report's CPU and memory efficiency, train_unet's threads).
inline constexpr char kSlurmCpusPerTask[] = "SLURM_CPUS_PER_TASK";
inline constexpr char kSlurmCpusOnNode[] = "SLURM_CPUS_ON_NODE";
inline constexpr char kSlurmMemPerNode[] = "SLURM_MEM_PER_NODE";  // MiB (--mem)
inline constexpr char kSlurmMemPerCpu[] = "SLURM_MEM_PER_CPU";    // MiB (--mem-per-cpu)

// Open MPI (mpirun)
inline constexpr char kOmpiWorldRank[] = "OMPI_COMM_WORLD_RANK";
inline constexpr char kOmpiWorldSize[] = "OMPI_COMM_WORLD_SIZE";
inline constexpr char kOmpiLocalRank[] = "OMPI_COMM_WORLD_LOCAL_RANK";
inline constexpr char kOmpiLocalSize[] = "OMPI_COMM_WORLD_LOCAL_SIZE";
inline constexpr char kOmpiNodeRank[] = "OMPI_COMM_WORLD_NODE_RANK";
inline constexpr char kOmpiJobId[] = "OMPI_MCA_orte_ess_jobid";

// PMIx (srun --mpi=pmix, prterun, flux)
inline constexpr char kPmixNamespace[] = "PMIX_NAMESPACE";
inline constexpr char kPmixRank[] = "PMIX_RANK";
inline constexpr char kPmixJobSize[] = "PMIX_JOB_SIZE";
inline constexpr char kPmixNumNodes[] = "PMIX_NUM_NODES";
inline constexpr char kPmixLocalSize[] = "PMIX_LOCAL_SIZE";

// Kubeflow's PyTorchJob and Run:ai pods
inline constexpr char kPetNnodes[] = "PET_NNODES";
inline constexpr char kPetNodeRank[] = "PET_NODE_RANK";
inline constexpr char kPetNprocPerNode[] = "PET_NPROC_PER_NODE";
inline constexpr char kPetRdzvEndpoint[] = "PET_RDZV_ENDPOINT";
inline constexpr char kPodIndex[] = "POD_INDEX";
inline constexpr char kJobUuid[] = "JOB_UUID";
inline constexpr char kJobName[] = "JOB_NAME";

// A torchrun-style static setup by hand (MASTER_ADDR with these; GROUP_RANK works too)
inline constexpr char kNodeRank[] = "NODE_RANK";
inline constexpr char kNnodes[] = "NNODES";

}  // namespace dlrun::sched

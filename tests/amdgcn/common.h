// Test kernels for AMDGPU code objects, built offline by clang (no ROCm, no libclc):
// work-item ids come from amdgcn builtins. The group size is read from the kernarg's
// hidden arguments (code object v5), so every kernel has them.
#define LID() ((int)__builtin_amdgcn_workitem_id_x())
#define GID() ((int)(__builtin_amdgcn_workgroup_id_x() * __builtin_amdgcn_workgroup_size_x()) + LID())
#define BARRIER() __builtin_amdgcn_s_barrier()

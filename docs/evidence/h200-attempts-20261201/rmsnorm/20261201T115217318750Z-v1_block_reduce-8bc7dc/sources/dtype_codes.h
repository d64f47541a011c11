// dtype codes shared by the torch glue and the torch-free launchers.
#pragma once
enum { MINI_KV_F32 = 0, MINI_KV_F16 = 1, MINI_KV_BF16 = 2, MINI_KV_F64 = 3 };

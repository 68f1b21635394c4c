-- A model whose column reduction (sum over axes 0 and 2 of c * r) sits next to
-- a reduction over axis 0 whose downstream full-shape values other kernels
-- read: the fuse pass once made a column kernel that would have had to store
-- them (test_fuse.c, test_unlowerable_groups).
local x = input("x", {2, 7, 33})
local w = param("w", {33, 33}, normal(0.1))
local h = x:matmul(w)
local r = nn.rmsnorm(h, param("g", {33}, ones()))
local c = h:sum(0, true) + h:max(2, true)        -- [1,7,33] + [2,7,1] -> [2,7,33]
local d = (c * r):sum({0, 2})                     -- [7]
local e = h:transpose(0, 2):reshape({33, 14}):sum(1):mean()
minimize(d:mean() + e + nn.gelu(h):mean() + nn.silu(h):mean())

-- A softmax over the leading axis (a column max) beside row and column sums
-- of the same values: a sibling merge once left the column max in a part of
-- its own that no kernel can compute (test_fuse.c, test_unlowerable_groups).
local x = input("x", {4, 9, 16})
local w = param("w", {16, 16}, normal(0.1))
local h = x:matmul(w)
local a = h:sum(0, true)                 -- col reduce [1,9,16]
local b = h:sum(2, true)                 -- row reduce [4,9,1]
local c = (h - a) * (h - b)              -- full shape, both
local d = c:sum(0):mean() + c:sum(1):mean() + c:max(2):mean()
local e = (h * h):sum({1}):mean()
minimize(d + e + nn.softmax(h, 0):max():reshape({1}):sum())

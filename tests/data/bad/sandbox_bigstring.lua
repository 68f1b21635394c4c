-- one allocation far past the memory limit
local x = input("x", {4, 8})
local s = string.rep("x", 1 << 30) -- ERROR
minimize(x:sum())

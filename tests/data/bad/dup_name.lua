-- a name used twice, once after a failed declaration caught by pcall
local x = input("x", {4, 8})
assert(not pcall(param, "w", {4, -1}, zeros()))
local w = param("w", {8}, zeros())
local v = param("w", {8}, zeros()) -- ERROR
minimize((x * w):sum())

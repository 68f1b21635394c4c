-- a Lua syntax error
local x = input("x", {4, 8})
local y = x +* 2 -- ERROR
minimize(y:sum())

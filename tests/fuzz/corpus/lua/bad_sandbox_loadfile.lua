-- loadfile reads any file
local x = input("x", {4, 8})
local f = loadfile("/etc/passwd") -- ERROR
minimize(x:sum())

-- load() of a binary chunk (bytecode, as string.dump makes): text chunks only
local x = input("x", {4, 8})
local bytecode = "\27LuaT\0\25\147\r\n\26\n\4\8\8xV\0\0\0\0\0\0\0\0\0\0\0(w@"
local f = load(bytecode) -- ERROR
minimize(x:sum())

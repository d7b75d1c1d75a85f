/*
 * A stand-in bcryptprimitives.dll for running the Windows library under Wine 8, which lacks it.
 * The Go runtime (1.24 and later) loads that DLL from system32 at start-up and takes its random
 * bytes from ProcessPrng; real Windows 10 and later have it. This one fills the buffer with
 * RtlGenRandom (advapi32's SystemFunction036), at most 1 GiB per call.
 * wheels/check.sh builds it with mingw-w64 into its own Wine prefix; it is never shipped.
 */
#include <windows.h>
#include <ntsecapi.h>

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    const SIZE_T most = (SIZE_T)1 << 30; /* RtlGenRandom takes a ULONG length */
    for (SIZE_T done = 0; done < len;) {
        ULONG part = (ULONG)(len - done < most ? len - done : most);
        if (!RtlGenRandom(data + done, part)) return FALSE;
        done += part;
    }
    return TRUE;
}
